"""``--fast``: the edit loop's subset — every test that took under 0.5 s in the last full run.

``tests/durations.json`` holds each test's seconds (setup + call + teardown) from a full run on
the CI machine; ``./scripts/test --record-durations`` updates it with the tests that ran.
``--fast`` deselects the tests recorded at 0.5 s or more, and every test of a module whose
shared (module-scoped) fixture took that long to set up: what remains are the unit tests. A
test the file does not know yet (new) runs: the next recording sorts it.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).resolve().parent / "durations.json"
SLOW_S = 0.5
"""A test recorded at this many seconds or more is left out of ``--fast``."""

_seen: dict[str, float] = defaultdict(float)
_setups: dict[str, float] = defaultdict(float)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("multigpu")
    group.addoption(
        "--fast",
        action="store_true",
        help=f"run only the tests recorded under {SLOW_S} s in tests/durations.json (the edit "
        "loop; CI runs everything)",
    )
    group.addoption(
        "--record-durations",
        action="store_true",
        help="rewrite tests/durations.json from this run (run the whole suite)",
    )


def _recorded() -> dict[str, float]:
    try:
        return dict(json.loads(DURATIONS.read_text()))
    except (OSError, ValueError):
        return {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    recorded = _recorded()
    if not config.getoption("--fast"):
        _longest_files_first(items, recorded)
        return
    shared = {
        nodeid.split("::", 1)[0] for nodeid, seconds in recorded.items() if nodeid.endswith(
            "::<module setup>") and seconds >= SLOW_S
    }  # fmt: skip
    keep, drop = [], []
    for item in items:
        slow = recorded.get(item.nodeid, 0.0) >= SLOW_S or item.nodeid.split("::")[0] in shared
        (drop if slow else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _longest_files_first(items: list[pytest.Item], recorded: dict[str, float]) -> None:
    """Order the files by their recorded seconds, longest first (each file's tests in order).

    ``--dist loadfile`` hands files to the test processes in this order: a long file left for
    the end would keep one process busy while the other idles (longest-first keeps the two
    within about the shortest file of each other). New files (not recorded) come first too.
    """
    seconds: dict[str, float] = defaultdict(float)
    for nodeid, value in recorded.items():
        if not nodeid.endswith("::<module setup>"):
            seconds[nodeid.split("::", 1)[0]] += value
    unknown = max(seconds.values(), default=0.0) + 1
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::", 1)[0], unknown))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _seen[report.nodeid] += report.duration
    if report.when == "setup":
        _setups[report.nodeid] = report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not session.config.getoption("--record-durations") or not _seen:
        return
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller writes
        return
    # A partial run updates the files it ran; in those, tests it did not see (moved, renamed,
    # removed) are dropped, else their seconds would stay on the old file for good.
    ran = {nodeid.split("::", 1)[0] for nodeid in _seen}
    out = {k: v for k, v in _recorded().items() if k.split("::", 1)[0] not in ran}
    modules: dict[str, float] = defaultdict(float)
    for nodeid, seconds in _seen.items():
        out[nodeid] = round(seconds, 3)
    # A module whose first test paid a long setup shares a fixture: remember it per module.
    for nodeid, seconds in _setups.items():
        module = nodeid.split("::", 1)[0] + "::<module setup>"
        modules[module] = max(modules[module], round(seconds, 3))
    out.update(modules)
    DURATIONS.write_text(json.dumps(dict(sorted(out.items())), indent=0) + "\n")

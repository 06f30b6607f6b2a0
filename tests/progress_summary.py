"""``--summary``: a line every tenth of the suite (or minute) instead of a dot per test.

The suite is ~1300 tests, most of them waiting on processes: 18 lines of dots say nothing about
where it is or how long is left. With ``--summary`` (``./scripts/test`` passes it unless ``-v``
is given) the run prints, as tests finish (also under xdist, where the controller gets
every report):

    [ 30%]  392/1308 tests  4:12 elapsed  0 failed

and a failure at once, as one line with its duration (its traceback comes at the end as usual).
The slowest tests come at the end through pytest's own ``--durations``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

EVERY_S = 60.0
"""At least one line this often, even between two tenths."""


class Summary:
    """Counts finished tests and writes the progress lines."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.started = time.monotonic()
        self.last_line = self.started
        self.done: set[str] = set()
        self.failed = 0
        self.tenth = 0

    def _write(self, text: str) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(text)

    def _elapsed(self) -> str:
        seconds = int(time.monotonic() - self.started)
        return f"{seconds // 60}:{seconds % 60:02d}"

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report: pytest.TestReport) -> Any:
        if hasattr(report, "wasxfail"):
            return None  # pytest's own words for xfail and xpass
        if report.when == "call" and report.passed:
            return "passed", "", ""
        if report.skipped:
            return "skipped", "", ""
        if report.failed:
            return ("failed" if report.when == "call" else "error"), "", ""
        return None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed and not hasattr(report, "wasxfail"):
            self.failed += 1
            where = {"call": "", "???": " (its test process died)"}.get(
                report.when, f" (in {report.when})"
            )
            self._write(f"FAILED {report.nodeid}{where} after {report.duration:.1f} s")
        if report.when != "teardown":
            return
        self.done.add(report.nodeid)
        total = getattr(self.config, "_summary_total", 0)
        tenth = 10 * len(self.done) // total if total else 0
        now = time.monotonic()
        if tenth > self.tenth or now - self.last_line >= EVERY_S:
            self.tenth, self.last_line = max(tenth, self.tenth), now
            share = f"{100 * len(self.done) // total:3d}%" if total else "  ?"
            self._write(
                f"[{share}] {len(self.done):>5}/{total} tests  {self._elapsed()} elapsed  "
                f"{self.failed} failed"
            )


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("multigpu").addoption(
        "--summary",
        action="store_true",
        help="a progress line every tenth of the run (or minute) instead of a dot per test",
    )


def pytest_configure(config: pytest.Config) -> None:
    if not config.getoption("--summary") or config.getoption("verbose") > 0:
        return
    if hasattr(config, "workerinput"):  # an xdist worker: the controller reports
        return
    config.pluginmanager.register(Summary(config), "multigpu-summary")


def pytest_collection_finish(session: pytest.Session) -> None:
    session.config._summary_total = len(session.items)  # type: ignore[attr-defined]


@pytest.hookimpl(optionalhook=True)  # defined by xdist, when it is loaded
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    config = node.config
    config._summary_total = max(getattr(config, "_summary_total", 0), len(ids))

"""The ``Example:`` sections of src/multigpu's docstrings run as doctests, every one of them:
an example that cannot run here belongs in docs/ or in a test, where it runs.

They run in a separate ``pytest --doctest-modules`` process: the examples call
``multigpu.init()`` and seed the RNGs, which must not leak into the other tests.
"""

from __future__ import annotations

import re
import subprocess
import sys

from tests.docs.blocks import ROOT

SKIP = re.compile(r"doctest:.*\+SKIP")  # any spelling of the directive


def test_every_docstring_example_in_src_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--doctest-modules", "src/multigpu", "-q",
         "-p", "no:cacheprovider", "-o", "addopts="],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert " passed" in done.stdout, done.stdout[-2000:]  # something was collected


def test_no_docstring_example_is_skipped() -> None:
    skipped = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "src" / "multigpu").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if SKIP.search(line)
    ]
    assert not skipped, f"examples that never run (make them run or move them to docs/): {skipped}"

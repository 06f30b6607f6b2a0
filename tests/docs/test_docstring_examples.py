"""The ``Example:`` sections of src/multigpu's docstrings run as doctests (``# doctest: +SKIP``
only where an example needs several processes, a GPU, a network or files it names).

They run in a separate ``pytest --doctest-modules`` process: the examples call
``multigpu.init()`` and seed the RNGs, which must not leak into the other tests.
"""

from __future__ import annotations

import subprocess
import sys

from tests.docs.blocks import ROOT


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

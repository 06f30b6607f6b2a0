"""The test harness itself: a test process that dies, hangs or leaves processes behind.

Each test runs pytest as ``./scripts/test`` does (xdist, ``--dist loadfile``, ``--summary``)
with the suite's own conftest (``-p tests.conftest``: its fixtures and plugins) on a small
test file written here, and reads what the run says.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

# Files the others end normally beside: a worker that finished while another was replaced once
# left xdist waiting for workers that were all gone (INTERNALERROR, exit 3).
OTHERS = {
    f"test_other{i}.py": "def test_one():\n    pass\n\n\ndef test_two():\n    pass\n"
    for i in range(3)
}


def _pytest(
    tmp_path: Path, source: str, *options: str, workers: int = 2
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run pytest on ``source`` as ``test_subject.py`` (and ``OTHERS``); its result, seconds."""
    (tmp_path / "test_subject.py").write_text(textwrap.dedent(source))
    for name, text in OTHERS.items():
        (tmp_path / name).write_text(text)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    env.pop("PYTEST_CURRENT_TEST", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    argv = [
        sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
        "-n", str(workers), "--dist", "loadfile", "--no-loadscope-reorder", "--summary", "-q",
        "--rootdir", str(tmp_path), *options, "test_subject.py", *OTHERS,
    ]  # fmt: skip
    began = time.monotonic()
    # The outer limit is the claim "within minutes": a run that hangs fails here.
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240, check=False)  # fmt: skip
    return done, time.monotonic() - began


def _crash_reports(out: str, test: str) -> int:
    """How many times the run reported ``test``'s worker crash (the report itself, not pytest's
    short summary, which repeats it in full on CI and cut to the terminal's width elsewhere)."""
    said = f"crashed while running 'test_subject.py::{test}'"
    return sum(1 for line in out.splitlines() if line.startswith("worker 'gw") and said in line)


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


# One worker: the file's last test alone goes to the new worker, which waited for a second one
# forever (the run hung); three, as ./scripts/test runs.
@pytest.mark.parametrize("workers", [1, 3])
def test_a_worker_that_aborts_fails_its_test_once_and_the_file_goes_on(
    tmp_path: Path, workers: int
) -> None:
    done, _ = _pytest(
        tmp_path,
        f"""
        import os, signal, subprocess, sys

        def test_before():
            pass

        def test_abort():
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                                     start_new_session=True)
            open({str(tmp_path / "child.pid")!r}, "w").write(str(child.pid))
            os.kill(os.getpid(), signal.SIGABRT)  # as libstdc++'s terminate() does

        def test_after():
            pass
        """,
        workers=workers,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    # Once: xdist 3.8 alone ran it again on each new worker, 13 times, then dropped the rest.
    assert _crash_reports(out, "test_abort") == 1, out
    assert "FAILED test_subject.py::test_abort (its test process died)" in out, out
    assert "worker 'gw" in out and "died of SIGABRT" in out, out
    # The worker's own fatal-error report, with the test's line, in the test's report.
    assert "Fatal Python error: Aborted" in done.stdout, out
    assert 'test_subject.py", line 11 in test_abort' in done.stdout, out
    assert "8 passed, 1 error" in done.stdout, out  # test_after ran on the new worker
    assert "maximum crashed workers" not in out, out
    child = int((tmp_path / "child.pid").read_text())
    assert f"pid {child}: " in done.stdout and _gone(child), out  # its orphan was ended


def test_a_native_hang_past_the_timeout_ends_the_worker_with_its_stacks(tmp_path: Path) -> None:
    done, seconds = _pytest(
        tmp_path,
        """
        import signal, time
        import pytest

        @pytest.mark.timeout(2)
        def test_hangs():
            # A C++ wait on a condition variable: SIGALRM, pytest-timeout's signal, never lands.
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(3600)

        def test_after():
            pass
        """,
        "-o",
        "worker_guard_grace=3",
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert _crash_reports(out, "test_hangs") == 1, out
    assert "ran 3 s past its timeout" in done.stdout and "Timeout (0:00:05)!" in done.stdout, out
    assert 'test_subject.py", line 9 in test_hangs' in done.stdout, out
    assert "7 passed, 1 error" in done.stdout, out
    assert seconds < 240  # (the hang itself was 3600 s)


def test_processes_left_running_fail_the_file_naming_the_test_and_are_killed(
    tmp_path: Path,
) -> None:
    done, _ = _pytest(
        tmp_path,
        f"""
        import subprocess, sys, time

        def test_clean():
            subprocess.run([sys.executable, "-c", "pass"], check=True)

        def test_leaves_one():
            time.sleep(0.1)  # start times are whole clock ticks: clear of the test before
            # Holding the run's stderr (no capture): CI's pipe stays open while it lives.
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                                     start_new_session=True, stderr=sys.__stderr__)
            open({str(tmp_path / "child.pid")!r}, "w").write(str(child.pid))
            time.sleep(0.1)  # and clear of the test after (the next can begin within a tick)

        def test_after():
            pass
        """,
        "-o",
        "worker_guard_settle=1",
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    child = int((tmp_path / "child.pid").read_text())
    assert "ERROR at teardown of test_after" in done.stdout, out
    assert "test_subject.py left 1 process(es) running after its last test (killed now)" in out
    assert f"pid {child}, started during test_subject.py::test_leaves_one: " in out, out
    assert "time.sleep(300)" in out and _gone(child), out
    assert "9 passed, 1 error" in done.stdout, out

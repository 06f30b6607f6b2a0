"""kill -9 of the launcher: its workers die with it, its checkpoint directory is free again.

One run trains slowly, checkpointing every step. A second run on the same directory is refused
with one line naming the holder (exit 2). Then the first launcher is SIGKILLed: within 5 s none
of its workers is alive (torch starts them in sessions of their own, so before the worker guard
they trained on), and a third run resumes from the newest complete checkpoint.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.launch._util import SCRIPTS, child_env, run_multigpu

SCRIPT = str(SCRIPTS / "slow_checkpoints.py")


def _alive(pid: int) -> bool:
    """Running (a zombie is dead: it only waits for a parent to collect its status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def _committed(directory: Path) -> list[int]:
    return sorted(
        int(p.name.split("-")[1]) for p in directory.glob("step-*") if (p / "COMMITTED").exists()
    )


def _wait_for(condition, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.1)


def test_killed_launcher_takes_its_workers_and_frees_the_directory(tmp_path: Path) -> None:
    ckpt, pids = tmp_path / "ckpt", tmp_path / "pids"
    log = tmp_path / "first.log"
    with log.open("wb") as fh:
        first = subprocess.Popen(
            [sys.executable, "-m", "multigpu", "run", "--cpu", "2", SCRIPT, str(ckpt), "100000"],
            cwd=tmp_path, env=child_env(), stdout=fh, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    workers: list[int] = []
    try:
        _wait_for(lambda: len(_committed(ckpt)) >= 2 and len(list(pids.glob("*"))) == 2, 120,
                  "the first run's checkpoints")  # fmt: skip
        workers = [int(p.read_text()) for p in pids.iterdir()]

        second = run_multigpu(["run", "--cpu", "2", SCRIPT, str(ckpt), "3"], tmp_path, timeout=60)
        assert second.returncode == 2, second.stderr
        last = second.stderr.strip().splitlines()[-1]
        assert f"checkpoint directory {ckpt.resolve()} is in use by another run" in second.stderr
        assert f"on {socket.gethostname()}" in second.stderr, second.stderr
        assert last.startswith("multigpu: error:"), second.stderr

        os.kill(first.pid, signal.SIGKILL)  # the launcher only, not its process group
        first.wait()
        killed_at = time.monotonic()
        _wait_for(lambda: not any(_alive(p) for p in workers), 5, "the workers to die")
        assert time.monotonic() - killed_at <= 5
    finally:
        for pid in [first.pid, *workers]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)  # started by this test (or its launcher)
    newest = _committed(ckpt)[-1]
    third = run_multigpu(
        ["run", "--cpu", "2", SCRIPT, str(ckpt), str(newest + 2)], tmp_path, timeout=120
    )
    assert third.returncode == 0, third.stderr
    assert f"resumed at step {newest}" in third.stdout, third.stdout
    assert f"finished at step {newest + 2}" in third.stdout
    leftover = list(Path(tempfile.gettempdir()).glob(f"multigpu-trace-{first.pid}-*"))
    assert not leftover, f"the killed launcher's trace directory stayed: {leftover}"

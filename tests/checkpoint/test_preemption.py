"""SIGTERM (preemption) with ``save_on_sigterm=True``: every rank saves the same step, then exits.

Only one worker gets the signal, as when a scheduler preempts one node first; the ranks agree
through a one-element all-reduce at the next step, so the checkpoint is complete and consistent.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from multigpu.checkpoint.native.layout import find_latest
from tests.launch._util import child_env

SCRIPT = Path(__file__).parent / "scripts" / "preemptible.py"


def test_sigterm_to_one_worker_saves_a_checkpoint_on_every_rank_and_exits_143(
    tmp_path: Path,
) -> None:
    log = tmp_path / "log.txt"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "multigpu", "run", "--cpu", "2", str(SCRIPT), str(tmp_path)],
            cwd=tmp_path,
            env=child_env({"MULTIGPU_LOG_LEVEL": "INFO"}),
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        pid_file = tmp_path / "rank-1.pid"
        while not pid_file.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert pid_file.exists(), log.read_text()
        os.kill(int(pid_file.read_text()), signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the session we started
            proc.wait()
    text = log.read_text()
    assert proc.returncode == 1, text  # a worker stopped: the launch failed, as it should
    assert "exited with code 143 (128 + SIGTERM)" in text.splitlines()[-1], text
    latest = find_latest(tmp_path / "ckpt")
    assert latest is not None and latest.step is not None and latest.step >= 6, text
    assert latest.manifest is not None and latest.manifest["world_size"] == 2
    # Both ranks saved that same step (one line each), though only rank 1 got the signal.
    assert text.count(f"saved step {latest.step} on SIGTERM") == 2, text

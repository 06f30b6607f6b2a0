"""A running ``multigpu train`` holds its ``--out``: a second one there is refused before it
starts, with or without checkpoints, instead of overwriting the first one's files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from multigpu.launch.train_outputs import OUT_LOCK_NAME
from tests.launch._util import child_env, run_multigpu


def test_a_second_train_on_a_running_ones_out_is_refused_and_writes_nothing(
    tmp_path: Path,
) -> None:
    out = tmp_path / "C"
    log = tmp_path / "first.txt"
    with log.open("w") as fh:
        first = subprocess.Popen(
            [sys.executable, "-m", "multigpu", "train", "--cpu", "1", "--out", str(out),
             "--epochs", "1000"],
            cwd=tmp_path, env=child_env(), stdout=fh, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while "/1000  loss" not in log.read_text() and time.monotonic() < deadline:
            assert first.poll() is None, log.read_text()
            time.sleep(0.2)
        held = (out / OUT_LOCK_NAME).read_text()
        assert held.startswith(f"pid {first.pid} on "), held
        second = run_multigpu(["train", "--cpu", "1", "--out", str(out), "--epochs", "1"], tmp_path)
    finally:
        os.killpg(first.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the first ends its way
        try:
            first.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    lines = second.stderr.strip().splitlines()
    assert second.returncode == 2, second.stderr
    assert lines == [
        f"multigpu: error: --out {out} is in use by another multigpu train ({held.strip()}); "
        "its model.pt, metrics.json and checkpoints would be overwritten: stop that run or wait "
        "for it to end, or give another --out"
    ], second.stderr
    assert first.returncode == 130, log.read_text()
    assert not (out / OUT_LOCK_NAME).exists()  # the first let it go as it ended
    again = run_multigpu(["train", "--cpu", "1", "--out", str(out), "--epochs", "1"], tmp_path)
    assert again.returncode == 0, again.stderr  # free once the first ended

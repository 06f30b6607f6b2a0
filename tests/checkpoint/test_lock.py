"""One run at a time per checkpoint directory, with a lock a dead run does not keep."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from multigpu.checkpoint.native.lock import LOCK_NAME, DirectoryLock
from multigpu.errors import CheckpointLockedError, UsageError

HOLD = """
import sys, time
from multigpu.checkpoint.native.lock import DirectoryLock
lock = DirectoryLock.acquire(sys.argv[1])
print("held", flush=True)
time.sleep(float(sys.argv[2]))
lock.release()
"""


def _holder(directory: Path, seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(directory), str(seconds)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def test_a_second_process_is_refused_with_the_holders_pid_and_host(tmp_path: Path) -> None:
    holder = _holder(tmp_path, 60)
    try:
        with pytest.raises(CheckpointLockedError) as caught:
            DirectoryLock.acquire(tmp_path)
        text = str(caught.value)
        assert f"checkpoint directory {tmp_path} is in use by another run " in text
        assert f"(pid {holder.pid} on {socket.gethostname()} since " in text
        assert "\n" not in text and isinstance(caught.value, UsageError)  # one line, exit 2
    finally:
        holder.kill()
        holder.wait()
    DirectoryLock.acquire(tmp_path).release()  # a killed holder keeps nothing


def test_waiting_gets_the_directory_when_the_holder_lets_go(tmp_path: Path) -> None:
    holder = _holder(tmp_path, 1.0)
    started = time.monotonic()
    lock = DirectoryLock.acquire(tmp_path, wait_s=30)
    assert 0.5 < time.monotonic() - started < 10
    holder.wait()
    lock.release()
    assert not (tmp_path / LOCK_NAME).exists()  # left as found


def test_one_process_shares_its_own_hold(tmp_path: Path) -> None:
    first = DirectoryLock.acquire(tmp_path)
    second = DirectoryLock.acquire(tmp_path)  # a second Checkpointer on the same directory
    first.release()
    assert (tmp_path / LOCK_NAME).exists()
    second.release()
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_bad_lock_timeout_is_a_usage_error(tmp_path: Path) -> None:
    import torch

    from multigpu.checkpoint.native.manager import Checkpointer
    from multigpu.strategies.single import SingleDeviceStrategy

    for bad in (-1, float("nan"), "10", True):
        with pytest.raises(UsageError, match="lock_timeout=.* must be a number of seconds >= 0"):
            Checkpointer(
                tmp_path, rank=0, world_size=1, adapter=SingleDeviceStrategy(),
                comm_device=torch.device("cpu"), timeout=10, lock_timeout=bad,  # type: ignore[arg-type]
            )  # fmt: skip
    assert os.listdir(tmp_path) == []

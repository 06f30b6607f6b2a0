"""`multigpu train` names a slow rank on each epoch's line, while it runs.

Once the job is set up (rank 1's import of torch would take long there), rank 1's process is put
into a CPU cgroup limited to ``SHARE`` of one core, as on a shared or throttled machine, so its
forward, data and optimizer time per step grows against rank 0's. Root and a CPU cgroup
controller are needed (CI has both); skipped otherwise.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.launch._util import popen_multigpu

V1 = Path("/sys/fs/cgroup/cpu")  # cgroup v1: cpu.cfs_quota_us / cpu.cfs_period_us
V2 = Path("/sys/fs/cgroup")  # cgroup v2: cpu.max
PERIOD_US = 20_000
SHARE = 0.05
"""Rank 1's cap, in cores. Rank 0 is not capped but shares the machine: at load 7-11 on 2 cores
each process got about a fifth of one, so a rank capped at 15 % was barely slower than its peer
and no epoch named it. Capped at 5 %, it is 1.5x slower (the line's 1.2x the median of two)
while the others get 7.5 % of a core or more: a load of about 25 on 2 cores."""


def _cgroup_root() -> Path | None:
    if os.geteuid() != 0:
        return None
    if (V1 / "cpu.cfs_quota_us").exists():
        return V1
    controllers = V2 / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return V2
    return None


@contextlib.contextmanager
def _throttled_cgroup(share: float) -> Iterator[Path]:
    """A new CPU cgroup allowed ``share`` of one core; removed afterwards."""
    root = _cgroup_root()
    if root is None:
        pytest.skip("needs root and a CPU cgroup controller to slow one rank down")
    group = root / f"multigpu-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        # A 20 ms period (the kernel's least quota is 1 ms: 5 % of 20 ms), not the default
        # 100 ms: an epoch of the digits job lasts about half a second, and a handful of long
        # pauses landed in the backward (timed as a collective) or outside it by chance; many
        # short ones slow each phase in proportion.
        if root == V1:
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(int(PERIOD_US * share)))
        else:
            (group / "cpu.max").write_text(f"{int(PERIOD_US * share)} {PERIOD_US}")
        yield group
    finally:
        for _ in range(50):  # the moved process has ended; the kernel lets go of it shortly
            with contextlib.suppress(OSError):
                group.rmdir()
                break
            time.sleep(0.1)


def _worker_pid(mark: str, rank: int, timeout: float = 60) -> int:
    """The pid of the worker of ``rank`` whose environment carries ``mark`` (ours only)."""
    wanted = {f"MULTIGPU_TEST_MARK={mark}".encode(), f"RANK={rank}".encode()}
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    env = set((entry / "environ").read_bytes().split(b"\0"))
                except OSError:
                    continue
                if wanted <= env:
                    return int(entry.name)
        time.sleep(0.1)
    raise AssertionError(f"no worker of rank {rank} appeared within {timeout} s")


def test_each_epoch_line_names_the_throttled_rank(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    with _throttled_cgroup(SHARE) as group:
        proc = popen_multigpu(
            ["train", "--cpu", "2", "--epochs", "2", "--progress", "lines"],
            tmp_path,
            MULTIGPU_TEST_MARK=mark,
            # One thread each, whatever the cores: 0.15 of a CPU shared by 8 threads (16 cores)
            # made the throttled rank too slow to finish 2 epochs in 120 s. (Its 2 epochs need
            # about 1 s of CPU: 20 s at 5 %.)
            OMP_NUM_THREADS="1",
        )
        try:
            assert proc.stdout is not None
            header = proc.stdout.readline()  # printed once set up, before the first step
            assert header.startswith("digits: "), header + proc.communicate(timeout=60)[1]
            (group / "cgroup.procs").write_text(str(_worker_pid(mark, rank=1)))
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    epochs = [line for line in out.splitlines() if line.startswith("epoch ")]
    assert len(epochs) == 2, out
    assert "  straggler: rank 1 " in epochs[-1] and "x the median step time" in epochs[-1], epochs
    assert "rank 1: " in err.split("per rank:", 1)[1] and "a straggler" in err  # the end summary

"""Which hooks (``multigpu.hooks``) a Context gets: chosen by the variables the launcher sets.

- ``MULTIGPU_VERIFY_DIR`` (``multigpu verify``): the verify probe (``multigpu.verify_record``);
- else ``MULTIGPU_BENCH_DIR`` (``multigpu bench scaling``): the step timer (``bench_record``);
- above one process: the hang tools (``multigpu.hang.hooks``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path

from multigpu import dist, variables
from multigpu.bench_record import BenchRecorder
from multigpu.env.types import ClusterEnv
from multigpu.hang import peers
from multigpu.hang.hooks import HangHook
from multigpu.hang.watchdog import start_watchdog
from multigpu.hooks import Hook
from multigpu.verify_record import VerifyRecorder


def choose_hooks(
    environ: Mapping[str, str],
    env: ClusterEnv,
    *,
    timeout: timedelta,
    info: dict[str, object],
) -> list[Hook]:
    """This worker's hooks, started (``info``: what the verify probe records of the run)."""
    recorder = verify_or_bench(environ, env.rank, env.world_size)  # a bad step count: now
    hooks: list[Hook] = []
    if env.world_size > 1:  # a liveness port per rank: after a failure, who is lost
        peers.start(env.rank, dist.gather_objects_small, env.master_addr)
        watchdog = start_watchdog(
            rank=env.rank, world_size=env.world_size, timeout=timeout, environ=environ
        )
        hooks.append(HangHook(watchdog, timeout))
    if recorder is not None:
        recorder.info.update(info)
        hooks.append(recorder)
    return hooks


def verify_or_bench(
    environ: Mapping[str, str], rank: int, world_size: int
) -> VerifyRecorder | None:
    """The probe of ``multigpu verify``, else the step timer of ``bench scaling``, else None."""
    for directory, steps, kind in (
        ("MULTIGPU_VERIFY_DIR", "MULTIGPU_VERIFY_STEPS", VerifyRecorder),
        ("MULTIGPU_BENCH_DIR", "MULTIGPU_BENCH_STEPS", BenchRecorder),
    ):
        if environ.get(directory):
            count = variables.read_count(environ, steps)
            return kind(Path(environ[directory]), count, rank, world_size)
    return None

"""``run_distributed``: run a function on N real processes, as ``torchrun`` would; collect results.

Each worker is a new process, forked from a server process that imported torch once (the
``forkserver`` start method: a fresh interpreter per worker costs ~1.5 s of CPU for ``import
torch`` alone, most of a small test), with the caller's environment and the torchrun variables
set (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``), ``GLOO_SOCKET_IFNAME=lo`` and one thread, so
``multigpu.init()`` inside the function builds a real gloo process group — on CPU processes even
on a machine with GPUs (``MULTIGPU_DEVICE=cpu``), unless ``device="cuda"`` asks for one GPU per
rank (NCCL). A worker's exception is re-raised in the parent with its traceback; a worker that
does not finish within ``timeout`` seconds is killed (by pid) and named in the error.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import socket
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any


class DistributedTestError(RuntimeError):
    """A worker of ``run_distributed`` raised, or did not finish in time."""


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _worker(
    fn: Callable[..., Any],
    args: Sequence[Any],
    env: Mapping[str, str],
    rank: int,
    results: mp.Queue,
) -> None:
    # This child process is the "launcher" of itself: setting its own environment is the point.
    # Whole: a forked worker inherits the fork server's environment, not the caller's.
    os.environ.clear()
    os.environ.update(env)
    try:
        import torch

        torch.set_num_threads(1)
        value = fn(*args)
        # Plain pickle copies tensor data into the message; the queue's own pickler would pass
        # shared-memory file descriptors that vanish when this process exits first.
        results.put((rank, True, pickle.dumps(value)))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))


def run_distributed(
    fn: Callable[..., Any],
    world_size: int = 2,
    *,
    args: Sequence[Any] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
    device: str = "cpu",
) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` processes and return their results, by rank.

    Args:
        fn: a module-level (picklable) function.
        args: positional arguments given to ``fn`` on every rank (picklable).
        env: extra environment variables for every worker.
        timeout: seconds for the whole run; past it every worker still running is killed.
        device: ``"cpu"`` (gloo, the default, also where GPUs exist) or ``"cuda"`` (rank r on
            GPU r, NCCL: the machine needs ``world_size`` GPUs).

    Raises:
        DistributedTestError: a worker raised (its traceback is in the message) or timed out.
    """
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r}; expected 'cpu' or 'cuda'")
    from multigpu.torch_compat import DDP_IMPORTS

    ctx = mp.get_context("forkserver")
    # Imported once by the server (a no-op once it runs); CUDA stays uninitialised there. With
    # what DDP imports at its first construction (1.5-2 s of CPU a worker otherwise).
    ctx.set_forkserver_preload(["torch", "torch.distributed", "multigpu", *DDP_IMPORTS])
    results: mp.Queue = ctx.Queue()
    port = free_port()
    procs = []
    for rank in range(world_size):
        child_env = dict(os.environ)
        child_env.update(
            GLOO_SOCKET_IFNAME="lo",
            OMP_NUM_THREADS="1",
            MKL_NUM_THREADS="1",
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_WORLD_SIZE=str(world_size),
            GROUP_RANK="0",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        if device == "cpu":
            child_env["MULTIGPU_DEVICE"] = "cpu"
        child_env.update(env or {})
        proc = ctx.Process(target=_worker, args=(fn, args, child_env, rank, results), daemon=False)
        proc.start()
        procs.append(proc)

    collected: dict[int, tuple[bool, Any]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(collected) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                rank, ok, value = results.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                if all(not p.is_alive() for p in procs) and any(p.exitcode for p in procs):
                    break
                continue
            collected[rank] = (ok, value)
            if not ok:
                # One rank failed: the others may wait forever in a collective.
                deadline = min(deadline, time.monotonic() + 10.0)
    finally:
        for proc in procs:
            proc.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())))
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)

    for rank, (ok, tb) in sorted(collected.items()):
        if not ok:
            raise DistributedTestError(f"rank {rank} of {world_size} raised:\n{tb}")
    missing = [r for r in range(world_size) if r not in collected]
    if missing:
        codes = {r: procs[r].exitcode for r in missing}
        raise DistributedTestError(
            f"ranks {missing} of {world_size} did not finish within {timeout:.0f} s "
            f"(exit codes {codes}); they were killed"
        )
    return [pickle.loads(collected[r][1]) for r in range(world_size)]

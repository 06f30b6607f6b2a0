"""The process-group check: a short all-reduce that proves the group works, and its bandwidth.

On its own (``check_collective_here``) the doctor runs ``multigpu bench comm``'s machinery:
``N`` workers started through the launcher (``python -m multigpu run``), one all-reduce checked
against the expected sum on every rank, then a few timed calls; the row gives the bus bandwidth
as nccl-tests defines it (``busbw = S/t x 2(n-1)/n``). Inside a launched job
(``check_collective_ranks``) the launched ranks themselves run the same sweep, over the real
path between the nodes.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from multigpu.diagnostics.doctor.checks import Check, fail, ok, one_line, skip

SIZES: tuple[int, ...] = (256 * 1024, 4 * 1024 * 1024)
"""The all-reduce sizes (bytes): the bandwidth is reported at the largest, "a few MB"."""
ITERS, WARMUP = 5, 2
"""Timed calls per size, untimed calls before them."""

NAME = "all-reduce"

log = logging.getLogger(__name__)


def result_check(
    rows: Sequence[Mapping[str, Any]],
    *,
    backend: str,
    world_size: int,
    seconds: float,
    who: str = "processes",
) -> Check:
    """The probe's row from ``bench comm``'s result rows: FAIL on a wrong sum, else the busbw."""
    if not rows:
        return fail(
            "process group",
            NAME,
            "the workers reported no measurement",
            "rerun with MULTIGPU_LOG_LEVEL=DEBUG and see `multigpu bench comm --ops all_reduce`",
        )
    wrong = [r for r in rows if not r["correct"]]
    detail = {"backend": backend, "world_size": world_size, "rows": [dict(r) for r in rows]}
    if wrong:
        sizes = ", ".join(str(r["size_bytes"]) for r in wrong)
        return fail(
            "process group",
            NAME,
            f"{world_size} processes, {backend}: WRONG sum at {sizes} bytes on some rank",
            "report it with this output: the backend returned wrong values; "
            "try the other backend (--backend gloo) to isolate it",
            **detail,
        )
    top = max(rows, key=lambda r: r["size_bytes"])
    mib = top["size_bytes"] / 1024**2
    value = (
        f"{world_size} {who}, {backend}: sum correct on every rank; {mib:g} MiB in "
        f"{top['time_us'] / 1000:.2f} ms: busbw {top['busbw_gbps']:.3f} GB/s, algbw "
        f"{top['algbw_gbps']:.3f} GB/s ({seconds:.1f} s in all)"
    )
    if world_size == 1:
        value = f"1 process, {backend}: the group started and the all-reduce ran (one device: "
        value += "no link to measure)"
    return ok("process group", NAME, value, **detail)


def failure_check(reason: str, *, backend: str, timeout: float) -> Check:
    """The probe's FAIL row for a group that did not start or a collective that failed."""
    fix = (
        "fix the FAIL/WARN rows above first (interfaces, port, versions); then rerun with "
        f"--timeout {max(2 * timeout, 120):g} (slow start) and NCCL_DEBUG=INFO / "
        "TORCH_CPP_LOG_LEVEL=INFO for the backend's own log"
    )
    return fail("process group", NAME, f"{backend}: {one_line(reason)[:400]}", fix)


def check_collective_here(*, backend: str, nproc: int, timeout: float, gpus: int) -> Check:
    """Start ``nproc`` workers on this machine through the launcher and all-reduce across them.

    ``backend`` is gloo (CPU processes) or nccl (one GPU each, at most ``gpus``, the GPUs this
    process sees); ``timeout`` bounds the whole probe, start-up included.
    """
    from multigpu.diagnostics.bench.comm import CommOptions, bench_comm
    from multigpu.errors import LaunchError

    if backend == "nccl" and gpus < nproc:
        return fail(
            "process group",
            NAME,
            f"nccl with {nproc} processes needs {nproc} GPUs; {gpus} visible",
            "use --backend gloo (CPU processes) or --nproc "
            f"{max(gpus, 1)}, or run where the GPUs are visible",
        )
    options = CommOptions(
        sizes=SIZES,
        ops=("all_reduce",),
        iters=ITERS,
        warmup=WARMUP,
        nproc=nproc,
        cpu=backend == "gloo",
        timeout=timeout,
    )
    log.info("doctor: all-reduce between %d %s processes ...", nproc, backend)
    started = time.perf_counter()
    bench_log = logging.getLogger(bench_comm.__module__)
    level = bench_log.level
    bench_log.setLevel(logging.WARNING)  # its "bench comm: ..." line would puzzle here
    with tempfile.TemporaryDirectory(prefix="multigpu-doctor-") as tmp:
        try:
            doc = bench_comm(options, Path(tmp))
        except LaunchError as e:
            return failure_check(str(e).splitlines()[0], backend=backend, timeout=timeout)
        finally:
            bench_log.setLevel(level)
    seconds = time.perf_counter() - started
    return result_check(
        doc["rows"], backend=doc["backend"], world_size=doc["world_size"], seconds=seconds
    )


def check_collective_ranks(*, backend: str, device: Any, timeout: float) -> Check:
    """All-reduce across the ranks of the initialised default group (every rank calls this)."""
    import torch.distributed as dist

    from multigpu.diagnostics.bench.comm_worker import sweep

    started = time.perf_counter()
    try:
        rows = sweep(("all_reduce",), SIZES, iters=ITERS, warmup=WARMUP, device=device)
    except Exception as e:  # a timeout or a lost peer: the row says so, every rank goes on
        return failure_check(f"{type(e).__name__}: {e}", backend=backend, timeout=timeout)
    seconds = time.perf_counter() - started
    world_size = dist.get_world_size()
    return result_check(rows, backend=backend, world_size=world_size, seconds=seconds, who="ranks")


def skipped(reason: str) -> Check:
    """The probe's row when it is not run."""
    return skip("process group", NAME, reason)

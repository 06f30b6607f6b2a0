"""The process-group check: a short all-reduce that proves the group works, and its bandwidth.

On its own (``check_collective_here``) the doctor runs ``multigpu bench comm``'s machinery:
``N`` workers started through the launcher (``python -m multigpu run``), one all-reduce checked
against the expected sum on every rank, then a few timed calls; the row gives the bus bandwidth
as nccl-tests defines it (``busbw = S/t x 2(n-1)/n``). Inside a launched job
(``check_collective_ranks``) the launched ranks themselves run the same sweep, over the real
path between the nodes.

The doctor inside a launched job: every rank checks itself, they all-reduce across each
other, share what they found, and rank 0 compares the nodes (``run_ranks``).

Run as ``multigpu run --nnodes 2 ... -m multigpu doctor`` (or ``--no-python multigpu doctor``),
each rank:

1. runs the local checks (its node's GPUs, interfaces, threads, versions);
2. starts the process group with ``torch.distributed`` directly, not ``multigpu.init()``, so
   that the start-up version check cannot stop the job before the doctor reports a mismatch;
3. runs the all-reduce probe across the launched ranks (the real path between the nodes);
4. gathers every rank's versions, interface MTU and rows (``all_gather_object``);
5. builds the same table as every other rank: rank 0's rows, other ranks' WARN and FAIL rows
   (once per host), and the comparison (``compare_ranks``): FAIL on different versions, WARN
   on different MTUs. Every rank so returns the same exit code; only rank 0 prints.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import tempfile
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from multigpu.diagnostics.doctor.checks import Check, fail, ok, one_line, skip, warn

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


def _places(found: Sequence[Mapping[str, Any]]) -> str:
    """``"node0 (ranks 0, 1), node1 (rank 2)"``: the hosts of these ranks."""
    hosts: dict[str, list[str]] = {}
    for facts in found:
        hosts.setdefault(str(facts["host"]), []).append(str(facts["rank"]))
    return ", ".join(
        f"{host} (rank{'s' if len(r) > 1 else ''} {', '.join(r)})" for host, r in hosts.items()
    )


def _where(found: Sequence[Mapping[str, Any]], values: Sequence[object]) -> str:
    """``"2.13.0 on node0 (ranks 0, 1); 2.12.1 on node1 (rank 2)"``."""
    by_value: dict[str, list[Mapping[str, Any]]] = {}
    for facts, value in zip(found, values, strict=True):
        by_value.setdefault(str(value), []).append(facts)
    return "; ".join(f"{value} on {_places(ranks)}" for value, ranks in by_value.items())


def compare_ranks(found: Sequence[Mapping[str, Any]]) -> list[Check]:
    """Compare the ranks' versions (FAIL per differing one) and interface MTUs (WARN).

    ``found``: every rank's ``{"rank", "host", "versions": {name: version}, "iface", "mtu"}``,
    in rank order.
    """
    rows = [ok("ranks", "hosts", f"{len(found)} ranks: {_places(found)}")]
    names = list(dict.fromkeys(name for facts in found for name in facts["versions"]))
    same = []
    for name in names:
        values = [facts["versions"].get(name, "missing") for facts in found]
        if len(set(values)) == 1:
            same.append(f"{name} {values[0]}")
            continue
        rows.append(
            fail(
                "ranks",
                name,
                _where(found, values),
                f"install the same {name} on every node (rank 0 has {values[0]}): ranks with "
                "different software pickle, bucket and pick collective algorithms differently, "
                "and hang or diverge",
            )
        )
    if same and len(same) == len(names):
        rows.append(ok("ranks", "versions", "the same on every rank: " + ", ".join(same)))
    rows.append(_mtu_check(found))
    return rows


def _mtu_check(found: Sequence[Mapping[str, Any]]) -> Check:
    known = [f for f in found if f.get("mtu")]
    if len({f["mtu"] for f in known}) <= 1:
        shown = f"{known[0]['mtu']} on every rank's interface" if known else "unknown"
        return ok("ranks", "MTU", shown)
    labels = [f"{f['mtu']} ({f.get('iface') or '?'})" for f in known]
    return warn(
        "ranks",
        "MTU",
        f"the ranks' interfaces differ: {_where(known, labels)}",
        "give the interface that connects the nodes the same MTU everywhere (ip link set dev "
        "NAME mtu N on each node) and pin it with `multigpu run --iface NAME`",
    )


def merge_rows(found: Sequence[Mapping[str, Any]]) -> list[Check]:
    """Rank 0's rows, then other ranks' WARN/FAIL rows that rank 0's host did not already show
    (one copy per host), then the comparison.
    """
    first = found[0]
    rows = [Check.from_dict(c) for c in first["checks"]]
    seen = {(first["host"], c.group, c.name, c.status, c.value) for c in rows}
    for facts in found[1:]:
        for check in map(Check.from_dict, facts["checks"]):
            key = (facts["host"], check.group, check.name, check.status, check.value)
            if check.status in ("WARN", "FAIL") and key not in seen:
                seen.add(key)
                where = f"rank {facts['rank']} ({facts['host']})"
                rows.append(dataclasses.replace(check, where=where))
    return [*rows, *compare_ranks(found)]


def run_ranks(
    facts: dict[str, Any],
    checks: Sequence[Check],
    *,
    backend: str,
    device: Any,
    timeout: float,
    store: str,
    probe: bool = True,
) -> tuple[list[Check], list[dict[str, Any]]]:
    """Start the group, probe, gather, compare; return (the table's rows, every rank's facts).

    ``facts`` is this rank's ``{"rank", "host", "versions", "iface", "mtu"}``; its rows
    (``checks`` and the probe's) are added before the gather. ``store`` is ``MASTER_ADDR:PORT``,
    for the row that says the ranks met there; ``probe=False`` skips the all-reduce only.
    """
    import torch
    import torch.distributed as dist

    spec = "cpu:gloo,cuda:nccl" if backend == "nccl" else "gloo"  # objects go over gloo
    try:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(spec, timeout=timedelta(seconds=timeout))
    except Exception as e:  # no such GPU, store or peer unreachable: report, do not raise
        failed = failure_check(f"{type(e).__name__}: {e}", backend=backend, timeout=timeout)
        return [*checks, failed], [facts]
    met = ok(
        "process group",
        "rendezvous",
        f"{dist.get_world_size()} ranks met at the job's store "
        f"{store} and started a {backend} group",
    )
    checks = [*checks, met]
    try:
        probed = (
            check_collective_ranks(backend=backend, device=device, timeout=timeout)
            if probe
            else skipped("--no-probe was given")
        )
        mine = {**facts, "checks": [c.as_dict() for c in (*checks, probed)]}
        found: list[dict[str, Any]] = [{}] * dist.get_world_size()
        try:
            dist.all_gather_object(found, mine)
        except Exception as e:
            gathered = fail(
                "ranks",
                "gather",
                f"the ranks could not share their results: {e}",
                "see the all-reduce row; every rank's own output has its rows",
            )
            return [*checks, probed, gathered], [facts]
        return merge_rows(found), [{k: v for k, v in f.items() if k != "checks"} for f in found]
    finally:
        gc.collect()  # nothing of ours holds the group; gloo's threads then stop cleanly
        dist.destroy_process_group()

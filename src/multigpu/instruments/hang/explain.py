"""Turn every rank's hang report into a few lines that say who waits where, and why.

A report (``Watchdog.report``) holds the rank's host, the collective it waits in (if any), where
its main thread is, its last collectives and how often it called each collective at each line.
Two facts explain almost every hang: ranks waiting in *different* collectives, and a call site
whose count differs between ranks (one rank skipped it, or ran it alone inside ``if rank == 0``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from multigpu.instruments.hang.trace import describe


def _where(rank: int, report: Mapping[str, Any] | None) -> str:
    if report is None:
        return (
            f"  rank {rank}: no report — its process died, its host is unreachable, or it is "
            "stuck in native code that holds the GIL"
        )
    host = report.get("host", "?")
    flight = report.get("in_flight")
    if flight:
        return f"  rank {rank} ({host}) waits in {describe(flight)} for {flight['waited_s']} s"
    recent = report.get("recent") or []
    last = f"; its last collective was {describe(recent[-1])}" if recent else ""
    return f"  rank {rank} ({host}) is in no collective: at {report.get('where', '?')}{last}"


def _count_mismatches(reports: Mapping[int, Mapping[str, Any]]) -> list[str]:
    sites = {site for report in reports.values() for site in report.get("site_counts", {})}
    lines = []
    for site in sorted(sites):
        counts = {r: rep.get("site_counts", {}).get(site, 0) for r, rep in sorted(reports.items())}
        if len(set(counts.values())) > 1:
            most = max(counts.values())
            short = [r for r, n in counts.items() if n < most]
            detail = ", ".join(
                f"{n} time{'' if n == 1 else 's'} on rank {r}" for r, n in counts.items()
            )
            who = "rank " + ", ".join(map(str, short))
            lines.append(
                f"  {site} ran {detail}: {who} skipped it, or the others ran it alone "
                "(a collective inside `if rank == ...` or a loop of different length)"
            )
    return lines


def explain(reports: Mapping[int, Mapping[str, Any]], world_size: int, after_s: float) -> list[str]:
    """The summary printed once per hang, by the lowest rank that reports.

    Example:
        >>> r0 = {"host": "a", "in_flight": {"op": "all_reduce", "seq": 5, "site": "t.py:9 in f()",
        ...        "shapes": [[1]], "dtype": "float32", "waited_s": 6.0}, "site_counts": {}}
        >>> explain({0: r0}, 2, 6.0)[1]
        '  rank 0 (a) waits in all_reduce #5 float32[1] at t.py:9 in f() for 6.0 s'
    """
    lines = [f"multigpu: hang: no collective has finished for {after_s:.0f} s; where each rank is:"]
    lines += [_where(rank, reports.get(rank)) for rank in range(world_size)]
    why: list[str] = []
    flights = {r: rep.get("in_flight") for r, rep in reports.items()}
    waiting = {r: f for r, f in flights.items() if f}
    idle = sorted(r for r, f in flights.items() if not f)
    kinds = {(f["op"], f["site"]) for f in waiting.values()}
    if len(kinds) > 1:
        why.append(
            "  the ranks wait in different collectives ("
            + "; ".join(f"rank {r}: {f['op']} at {f['site']}" for r, f in sorted(waiting.items()))
            + "): they no longer call collectives in the same order"
        )
    if waiting and idle:
        why.append(
            f"  rank {', '.join(map(str, idle))} is in no collective while rank "
            f"{', '.join(map(str, sorted(waiting)))} waits: a collective that only some ranks "
            "run, or one rank busy elsewhere (slow data, an endless loop, evaluation on rank 0)"
        )
    why += _count_mismatches(reports)
    missing = [r for r in range(world_size) if r not in reports]
    if missing:
        why.append(f"  no report from rank {', '.join(map(str, missing))}: check that it is alive")
    if why:
        lines.append("why:")
        lines += why
    return lines

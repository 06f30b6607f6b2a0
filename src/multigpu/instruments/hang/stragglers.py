"""Straggler report: which rank computes slower than the others, measured outside collectives.

In data-parallel training every rank waits for the slowest at each gradient all-reduce, so
wall-clock step times are equal everywhere; the time a rank spends *outside* collectives (its
forward pass, data loading, optimizer step) is what differs. At the end of a run each rank's
busy time per step is gathered, and a rank at least 20 % above the median is named.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

SLOW = 1.2
"""A rank this many times the median busy time per step is a straggler."""


def straggler_lines(busy: Sequence[tuple[float, int]]) -> list[str]:
    """Lines naming slow ranks, from every rank's (busy seconds, steps); empty when none is.

    Example:
        >>> straggler_lines([(1.0, 100), (1.0, 100), (1.6, 100)])[1]
        '  rank 2: 16.0 ms per step, 1.60x the median (10.0 ms): a straggler'
    """
    per_step, median = _per_step(busy)
    slow = [(r, t) for r, t in enumerate(per_step) if t >= SLOW * median]
    if not slow:
        return []
    lines = ["multigpu: step time outside collectives (forward, data, optimizer) per rank:"]
    lines += [
        f"  rank {r}: {t * 1000:.1f} ms per step, {t / median:.2f}x the median "
        f"({median * 1000:.1f} ms): a straggler"
        for r, t in slow
    ]
    lines.append(
        "  every other rank waits for it at each gradient all-reduce: look at its data loading, "
        "its device (clock, temperature, other jobs) or an uneven share of work"
    )
    return lines


def slowest(busy: Sequence[tuple[float, int]]) -> tuple[int, float] | None:
    """(rank, its busy time per step / the median) of the slowest rank, or None.

    Example:
        >>> slowest([(1.0, 100), (1.5, 100)])
        (1, 1.2)
    """
    per_step, median = _per_step(busy)
    if not per_step:
        return None
    rank = max(range(len(per_step)), key=per_step.__getitem__)
    return rank, round(per_step[rank] / median, 2)


def _per_step(busy: Sequence[tuple[float, int]]) -> tuple[list[float], float]:
    """Each rank's busy seconds per step and their median; ``[]`` when not comparable."""
    per_step = [b / s for b, s in busy if s > 0]
    median = statistics.median(per_step) if len(per_step) == len(busy) > 1 else 0.0
    return (per_step, median) if median > 0 else ([], 0.0)

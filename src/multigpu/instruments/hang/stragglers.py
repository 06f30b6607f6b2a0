"""Straggler report: which rank computes slower than the others, measured outside collectives.

In data-parallel training every rank waits for the slowest at each gradient all-reduce, so
wall-clock step times are equal everywhere; the time a rank spends *outside* collectives (its
forward pass, data loading, optimizer step) is what differs. At the end of a run each rank's
busy time per step is gathered, and a rank at least 20 % and 2 ms above the median is named.
The 2 ms floor keeps scheduler noise on tiny steps (0.7 ms against 0.5 ms is "1.4x") from being
reported as a straggler nobody could act on.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

SLOW = 1.2
"""A rank this many times the median busy time per step is a straggler..."""

MIN_EXCESS_S = 0.002
"""...when it also costs every other rank at least this long a wait per step."""


def is_straggler(per_step_s: float, median_s: float) -> bool:
    """Whether a rank busy ``per_step_s`` per step, against the median ``median_s``, is slow.

    Example:
        >>> is_straggler(0.016, 0.010), is_straggler(0.0007, 0.0005)
        (True, False)
    """
    return per_step_s >= SLOW * median_s and per_step_s - median_s >= MIN_EXCESS_S


def straggler_lines(busy: Sequence[tuple[float, int]]) -> list[str]:
    """Lines naming slow ranks, from every rank's (busy seconds, steps); empty when none is.

    Example:
        >>> straggler_lines([(1.0, 100), (1.0, 100), (1.6, 100)])[1]
        '  rank 2: 16.0 ms per step, 1.60x the median (10.0 ms): a straggler'
    """
    per_step, median = _per_step(busy)
    slow = [(r, t) for r, t in enumerate(per_step) if is_straggler(t, median)]
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


def slowest(busy: Sequence[tuple[float, int]]) -> tuple[int, float, bool] | None:
    """(rank, its busy time per step / the median, whether it is a straggler) of the slowest
    rank, or None.

    Example:
        >>> slowest([(1.0, 100), (1.5, 100)])
        (1, 1.2, True)
    """
    per_step, median = _per_step(busy)
    if not per_step:
        return None
    rank = max(range(len(per_step)), key=per_step.__getitem__)
    return rank, round(per_step[rank] / median, 2), is_straggler(per_step[rank], median)


def _per_step(busy: Sequence[tuple[float, int]]) -> tuple[list[float], float]:
    """Each rank's busy seconds per step and their median; ``[]`` when not comparable."""
    per_step = [b / s for b, s in busy if s > 0]
    median = statistics.median(per_step) if len(per_step) == len(busy) > 1 else 0.0
    return (per_step, median) if median > 0 else ([], 0.0)

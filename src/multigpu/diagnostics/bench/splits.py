"""The ways to split a machine's CPU cores into processes × threads, and the fastest of them.

``multigpu bench scaling`` measures every split ``p × t`` with ``p · t = cores`` (on 2 cores:
1 × 2 and 2 × 1) and recommends the one with the most samples per second.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from typing import TextIO

from rich.console import Console


def core_splits(cores: int) -> list[tuple[int, int]]:
    """Every (processes, threads) with ``processes * threads == cores``, fewest processes first.

    Example:
        >>> core_splits(12)[:3]
        [(1, 12), (2, 6), (3, 4)]
    """
    return [(p, cores // p) for p in range(1, cores + 1) if cores % p == 0]


def fastest(measured: Mapping[tuple[int, int], float | None]) -> tuple[int, int] | None:
    """The split with the highest throughput (None when none was measured); ties: fewer processes.

    Example:
        >>> fastest({(1, 2): 900.0, (2, 1): 1200.0, (4, 1): None})
        (2, 1)
    """
    ok = {split: value for split, value in measured.items() if value is not None}
    if not ok:
        return None
    return max(sorted(ok), key=lambda split: ok[split])


def split_label(processes: int, threads: int | None) -> str:
    """``"2x1"``: processes x threads, the key used in tables, JSON and the cache; ``"2 GPU(s)"``
    without threads (on GPUs)."""
    return f"{processes} GPU(s)" if threads is None else f"{processes}x{threads}"


BUSY_LOAD = 0.5
"""A 1-minute load average at or above this before a benchmark means other work shared the CPU."""


def load_before() -> float | None:
    """The 1-minute load average now (None where the system does not say)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def busy_note(load: float | None) -> str | None:
    """A warning line when the machine was busy before the benchmark started, else None."""
    if load is None or load < BUSY_LOAD:
        return None
    return (
        f"note: the load average was {load:g} when the benchmark started: other processes were "
        "using the CPU, so CPU figures (multi-threaded ones most) are lower and noisier than on "
        "an idle machine"
    )


def report_console(headline: str, load: float | None, file: TextIO | None = None) -> Console:
    """A console at least 100 columns wide, with ``headline`` and the busy note printed.

    ``load``: the load average before the benchmark (None where it says nothing: on GPUs).
    """
    console = Console(
        file=file or sys.stdout,
        width=max(100, shutil.get_terminal_size().columns),
        soft_wrap=True,
        highlight=False,
    )
    console.print(headline, markup=False)
    if busy := busy_note(load):
        console.print(busy, markup=False)
    return console

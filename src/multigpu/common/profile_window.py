"""The window of optimizer steps a profile covers: ``START:END``, counted from 1, both traced.

Read from ``--profile`` (the built-in jobs), ``multigpu.init(profile=)`` and ``MULTIGPU_PROFILE``
alike; no torch here (the launcher checks the flag before any worker starts).
"""

from __future__ import annotations

EXAMPLE = "3:5"


def parse_window(
    text: str, *, given: str | None = None, example: str = f"--profile {EXAMPLE}"
) -> tuple[int, int]:
    """``(first, last)`` optimizer steps of ``text`` (``"3:5"``: steps 3, 4 and 5); ``given``
    and ``example`` name the value and a good one in the message (default: ``--profile``'s).

    Raises:
        ValueError: one line saying what was given, what is expected and an example.

    Example:
        >>> parse_window("3:5"), parse_window("2:2")
        ((3, 5), (2, 2))
    """
    given = given or f"--profile {text}"
    expected = (
        f"expected FIRST:LAST, optimizer steps counted from 1 with FIRST <= LAST, e.g. {example}"
    )
    first, sep, last = text.strip().partition(":")
    if not sep or not first.isdigit() or not last.isdigit():
        raise ValueError(f"{given}: not two step numbers; {expected}")
    window = int(first), int(last)
    if window[0] < 1:
        raise ValueError(f"{given}: steps count from 1; {expected}")
    if window[0] > window[1]:
        raise ValueError(f"{given}: the first step is after the last; {expected}")
    return window

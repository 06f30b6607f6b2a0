"""Byte sizes and collective names for ``multigpu bench comm``: parsing, default sweep, printing.

``--sizes`` takes a comma list (``1K,64K,1M``) or a geometric range ``MIN:MAX[:FACTOR]``
(``8:64M`` = 8 B, 32 B, ... up to 64 MB, times 4 by default). Suffixes are binary, as in
nccl-tests: K = 1024, M = 1024², G = 1024³ (an optional trailing ``B`` or ``iB`` is accepted).
"""

from __future__ import annotations

import re

from multigpu.errors import UsageError

OPS: tuple[str, ...] = ("all_reduce", "all_gather", "broadcast", "reduce_scatter")
"""The collectives ``multigpu bench comm`` measures, in the order it runs them."""

DEFAULT_SIZES: tuple[int, ...] = tuple(4**k for k in range(2, 14))
"""16 B, 64 B, ... 64 MB: every power of 4 (the smallest holds one float32 per rank at 4 ranks)."""

MAX_SIZE = 1 << 40
"""1 TiB: a larger size is surely a typo, refused before any memory is allocated."""

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """One size in bytes, 1 B to 1 TiB: ``"64"``, ``"1K"``, ``"64MB"``, ``"2GiB"`` (binary
    units); anything else is a UsageError."""
    match = _SIZE.match(text)
    value = int(match.group(1)) * _UNITS[match.group(2).upper()] if match else 0
    if not 1 <= value <= MAX_SIZE:
        raise UsageError(
            f"--sizes: {text!r} is not a size; expected bytes >= 1 and <= 1T with an optional "
            "K, M or G suffix (binary), e.g. --sizes 1K,64K,1M or --sizes 8:64M"
        )
    return value


def parse_sizes(text: str) -> tuple[int, ...]:
    """``--sizes``: a comma list of sizes, or ``MIN:MAX[:FACTOR]`` (geometric, factor 4).

    Sizes keep the order given; repeats are dropped. UsageError for a bad size, MIN > MAX, or a
    factor below 2.

    Example:
        >>> parse_sizes("8:512")
        (8, 32, 128, 512)
        >>> parse_sizes("1K,64K")
        (1024, 65536)
    """
    if ":" in text:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise UsageError(
                f"--sizes {text!r} is not a range; expected MIN:MAX or MIN:MAX:FACTOR, "
                "e.g. --sizes 8:64M or --sizes 1K:1M:2"
            )
        low, high = parse_size(parts[0]), parse_size(parts[1])
        factor = int(parts[2]) if len(parts) == 3 and parts[2].strip().isdigit() else 0
        factor = 4 if len(parts) == 2 else factor
        if low > high or factor < 2:
            raise UsageError(
                f"--sizes {text!r}: expected MIN <= MAX and a whole FACTOR >= 2, "
                "e.g. --sizes 8:64M (times 4) or --sizes 8:64M:2"
            )
        sizes = [low]
        while sizes[-1] * factor <= high:
            sizes.append(sizes[-1] * factor)
        return tuple(sizes)
    values = [parse_size(part) for part in text.split(",") if part.strip()]
    if not values:
        raise UsageError(f"--sizes {text!r} names no size; expected e.g. --sizes 1K,64K,1M")
    return tuple(dict.fromkeys(values))


def parse_ops(text: str) -> tuple[str, ...]:
    """``--ops``: a comma list of collectives (``all_reduce``, ``all-gather``...; ``all``).

    Example:
        >>> parse_ops("all-reduce,broadcast")
        ('all_reduce', 'broadcast')
    """
    names: list[str] = []
    for part in text.split(","):
        name = part.strip().lower().replace("-", "_")
        if name == "all":
            names.extend(OPS)
        elif name in OPS:
            names.append(name)
        elif name:
            raise UsageError(
                f"--ops: {part.strip()!r} is not a collective multigpu measures; expected "
                f"some of {', '.join(OPS)} (or all), e.g. --ops all_reduce,all_gather"
            )
    if not names:
        raise UsageError(f"--ops {text!r} names no collective; expected e.g. --ops all_reduce")
    return tuple(dict.fromkeys(names))


def format_size(size: int) -> str:
    """A byte count the way ``--sizes`` accepts it: ``64 B``, ``1 KB``, ``1.5 MB`` (binary).

    Example:
        >>> format_size(64 << 20), format_size(48)
        ('64 MB', '48 B')
    """
    for unit, factor in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if size >= factor:
            value = size / factor
            return f"{value:.0f} {unit}" if value.is_integer() else f"{value:.3g} {unit}"
    return f"{size} B"

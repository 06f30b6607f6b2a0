"""The names a user chooses from (strategies, precisions, compressions, backends, devices).

Plain tuples, no torch: the launcher checks options and ``MULTIGPU_*`` variables against them
before any worker starts, and the job parsers offer them as ``choices``; the modules that act on
a name (``multigpu.strategies``, ``multigpu.runtime.precision``, ``multigpu.runtime.device``) take
them from here.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

STRATEGY_NAMES = ("auto", "single", "dp", "ddp", "fsdp", "pipeline")
"""``multigpu.init(strategy=)``, ``MULTIGPU_STRATEGY`` and ``multigpu train --strategy``."""

PIPELINE_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
"""``PipelineStrategy(schedule=)`` and ``multigpu train --schedule``."""

PRECISIONS = ("32", "bf16-mixed", "16-mixed")
"""``multigpu.init(precision=)`` and ``multigpu train --precision`` (canonical names)."""

COMPRESSIONS = ("none", "bf16", "fp16", "powersgd")
"""``DDPStrategy(compression=)``, ``MULTIGPU_COMPRESSION`` and ``--compression``."""

BACKENDS = ("nccl", "gloo")
"""Process-group backends: ``multigpu.init(backend=)``, ``MULTIGPU_BACKEND`` (or ``auto``)."""

DEVICES = ("auto", "cpu")
"""``MULTIGPU_DEVICE``: ``cpu`` keeps a rank on the CPU where CUDA is present (``multigpu run
--cpu`` sets it); ``auto`` (or unset): CUDA when present."""


def did_you_mean(given: str, names: Iterable[str]) -> str:
    """``"; did you mean NAME?"`` for the name of ``names`` closest to ``given`` (difflib), or
    ``""`` when none is close: the tail of a one-line refusal of a mistyped choice.

    Example:
        >>> did_you_mean("fsdpp", STRATEGY_NAMES)
        '; did you mean fsdp?'
        >>> did_you_mean("bf16", PRECISIONS)
        '; did you mean bf16-mixed?'
        >>> did_you_mean("xyz", STRATEGY_NAMES)
        ''
    """
    given, choices = str(given).lower(), [str(n) for n in names]
    close = difflib.get_close_matches(given, choices, n=1, cutoff=0.6)
    if not close and given:  # a prefix of one name only: "bf16" for "bf16-mixed"
        close = [n for n in choices if n.startswith(given)][:2]
        close = close if len(close) == 1 else []
    return f"; did you mean {close[0]}?" if close else ""

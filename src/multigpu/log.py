"""Logging helpers: rank-prefixed loggers, rank-zero-only calls, warn-once.

Handlers are configured only by the command line (``configure``); the library never touches the
root logger.
"""

from __future__ import annotations

import logging
import os
import sys

from multigpu import variables

_warned: set[str] = set()


def _env_rank() -> int:
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def warn_once(logger: logging.Logger, message: str, *args: object) -> None:
    """Log ``message`` as a warning the first time it is seen in this process only."""
    key = message % args if args else message
    if key in _warned:
        return
    _warned.add(key)
    logger.warning(message, *args)


class _RankFilter(logging.Filter):
    def __init__(self, rank: int | None) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        rank = self.rank if self.rank is not None else _env_rank()
        record.rank_prefix = f"[rank{rank}] "
        return True


def configure(level: str | int | None = None, rank: int | None = None) -> None:
    """Send multigpu's log records to stderr as whole lines with a rank prefix (CLI only)."""
    chosen = level or variables.log_level(os.environ)
    logger = logging.getLogger("multigpu")
    logger.setLevel(chosen if isinstance(chosen, int) else chosen.upper())
    if any(getattr(h, "_multigpu", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(rank_prefix)s%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_RankFilter(rank))
    handler._multigpu = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.propagate = False

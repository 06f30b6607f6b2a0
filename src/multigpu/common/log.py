"""Logging helpers: warn-once.

Handlers are configured only by the command line (``multigpu.cli.main``); the library never
touches the root logger.
"""

from __future__ import annotations

import logging

_warned: set[str] = set()


def warn_once(logger: logging.Logger, message: str, *args: object) -> None:
    """Log ``message`` as a warning the first time it is seen in this process only."""
    key = message % args if args else message
    if key in _warned:
        return
    _warned.add(key)
    logger.warning(message, *args)

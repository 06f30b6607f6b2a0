"""Tracing a model for a pipeline, with a refusal a user can act on when the trace fails.

``torch.distributed.pipelining`` traces the whole model with ``torch.export``. A forward whose
Python control flow depends on a tensor's values (``if x.sum() > 0:``) cannot be one graph:
torch then printed the partial graph twice and a warning on stderr and raised a chained error
of ~60 lines, so a two-process run ended in 465 lines. Here the trace's own output is held back
(printed only when the trace succeeds) and its failure becomes one ``UsageError`` naming the
model, the line of the user's code torch's error gives, and what to do.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import sys
from collections.abc import Callable, Iterator
from typing import TypeVar

from torch import nn

from multigpu.errors import UsageError

T = TypeVar("T")

# torch.export's error quotes the user's frame: `  File "x.py", line 7, in forward\n    code`.
_USER_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(\S[^\n]*)')
_QUIET_LOGGERS = ("torch.fx.experimental.symbolic_shapes", "torch._export", "torch.export")


@contextlib.contextmanager
def _held_back() -> Iterator[io.StringIO]:
    """Inside the block, what torch prints and its export loggers' warnings go to a buffer."""
    loggers = [logging.getLogger(name) for name in _QUIET_LOGGERS]
    levels = [logger.level for logger in loggers]
    buffer = io.StringIO()
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            yield buffer
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def user_frame(error: BaseException) -> str | None:
    """``file:line in function: `code``` of the user's code in torch's chain of errors, if it
    names one.

    Example:
        >>> user_frame(RuntimeError('File "/a/m.py", line 7, in forward\\n    if x.sum() > 0:'))
        '/a/m.py:7 in forward: `if x.sum() > 0:`'
    """
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        found = _USER_FRAME.findall(str(cause))
        user = [f for f in found if "/site-packages/" not in f[0] and "/torch/" not in f[0]]
        if user:
            path, line, function, code = user[-1]
            return f"{path}:{line} in {function}: `{code.strip()}`"
        cause = cause.__cause__ or cause.__context__
    return None


def trace_for_pipeline(model: nn.Module, trace: Callable[[], T]) -> T:
    """``trace()`` (torch's pipeline tracing of ``model``) with its output held back; its
    failure raised as a one-line UsageError."""
    try:
        with _held_back() as said:
            result = trace()
    except Exception as e:
        where = user_frame(e)
        at = f" at {where}" if where else f" ({_first_line(e)})"
        raise UsageError(
            f"strategy='pipeline' cannot trace {type(model).__name__}'s forward as one graph "
            f"(torch.export){at}: control flow that depends on a tensor's values cannot be cut "
            "into stages; make the branch static (decide it from Python values or the "
            "configuration, or use torch.cond), or use strategy='fsdp' or 'ddp', which do not "
            "trace"
        ) from e
    sys.stderr.write(said.getvalue())  # a trace that worked: whatever it said, as before
    return result


def _first_line(error: BaseException) -> str:
    while error.__cause__ is not None:
        error = error.__cause__
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"

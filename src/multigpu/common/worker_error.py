"""A worker's error, written where its launcher reads it: torch elastic's error file, extended.

torch's agent gives each worker a path in ``TORCHELASTIC_ERROR_FILE`` and reads the JSON found
there when the worker fails (``@record`` writes it, for entry points that use it; users' scripts
do not). A multigpu worker writes it when an exception leaves ``with multigpu.init()``, in
torch's format (``message.message``, ``message.extraInfo.py_callstack``/``timestamp``: torch's
own report keeps working), plus a ``multigpu`` entry with what the launcher's one-line summary
needs: the exception's type, whether it is a usage error (exit code 2), the host, a precise time
(torch's is whole seconds, too coarse to tell which rank failed first) and whether it is the
consequence of another rank's failure (a collective whose peer went away).

Both sides are here so that the format is defined once: ``record`` runs in workers, ``read`` in
the launcher. No torch import.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import traceback
from dataclasses import dataclass
from typing import Any

from multigpu.common.atomic_file import atomic_write
from multigpu.errors import UsageError

ERROR_FILE_VARIABLE = "TORCHELASTIC_ERROR_FILE"
AGENT_PID_VARIABLE = "MULTIGPU_AGENT_PID"
"""Set by ``multigpu run`` for its workers (``launch/worker_guard.py`` reads it too)."""
PEER_GONE_MARKERS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
"""How gloo says that the other end of a collective went away: the failure of another rank."""


@dataclass(frozen=True)
class WorkerError:
    """What a failed worker recorded about its exception."""

    type: str
    message: str
    usage: bool
    host: str
    time: float
    consequence: bool
    said_in_full: bool = False
    """The message is the whole story (``MultiGPUError.said_in_full``): no traceback to read."""
    final: bool = False
    """Starting the workers again cannot help (``MultiGPUError.final``): no restart."""


def record(error: BaseException | None, environ: Any = None) -> bool:
    """Write ``error`` to this worker's error file, if its launcher gave one. True when written.

    ``KeyboardInterrupt`` and ``SystemExit`` are not errors to report.
    """
    env = os.environ if environ is None else environ
    path = env.get(ERROR_FILE_VARIABLE)
    if not path or error is None or isinstance(error, KeyboardInterrupt | SystemExit):
        return False
    now = time.time()
    data = {
        "message": {
            "message": f"{type(error).__name__}: {error}",
            "extraInfo": {
                "py_callstack": "".join(traceback.format_exception(error)),
                "timestamp": str(int(now)),
            },
        },
        "multigpu": {
            "type": type(error).__name__,
            "message": own_message(error),
            "usage": isinstance(error, UsageError),
            "host": socket.gethostname(),
            "time": now,
            "consequence": is_consequence(error),
            "said_in_full": bool(getattr(error, "said_in_full", False)),
            "final": bool(getattr(error, "final", False)),
        },
    }
    try:
        # Whole or absent: a worker stopped while writing (the agent ends the others once one
        # fails) must not leave a truncated file, which torch's agent cannot parse and answers
        # by ending the whole launch with a JSONDecodeError instead of the failure.
        atomic_write(path, lambda fh: fh.write(json.dumps(data).encode()), durable=False)
    except OSError:
        return False  # the launcher then reports the exit code alone
    return True


def own_message(error: BaseException) -> str:
    r"""``error``'s message, without the wrapper a DataLoader worker's exception gets in the main
    process (torch re-raises it as the same type with ``Caught X in DataLoader worker process
    N.`` and the worker's whole traceback as its message): there, the original's last line.

    Example:
        >>> own_message(ValueError("Caught ValueError in DataLoader worker process 0.\n"
        ...     "Original Traceback (most recent call last):\n  File ...\nValueError: bad row 3"))
        'bad row 3'
    """
    message = str(error)
    if not (message.startswith("Caught ") and "\nOriginal Traceback" in message):
        return message
    last = [line for line in message.splitlines() if line.strip()][-1]
    name = type(error).__name__  # the traceback names it qualified: multigpu.errors.DataError
    head, _, rest = last.partition(": ")
    return rest if head == name or head.endswith(f".{name}") else last


def read(data: Any) -> WorkerError | None:
    """The ``WorkerError`` in an error file's parsed JSON ``data``; None when not ours."""
    entry = data.get("multigpu") if isinstance(data, dict) else None
    if not isinstance(entry, dict):
        return None
    try:
        return WorkerError(
            type=str(entry["type"]),
            message=str(entry["message"]),
            usage=bool(entry["usage"]),
            host=str(entry["host"]),
            time=float(entry["time"]),
            consequence=bool(entry.get("consequence", False)),
            said_in_full=bool(entry.get("said_in_full", False)),
            final=bool(entry.get("final", False)),
        )
    except (KeyError, TypeError, ValueError):
        return None


def launched_by_multigpu() -> bool:
    """True in a worker of ``multigpu run`` (whose launcher prints the one-line summary), false
    under plain torchrun."""
    return bool(os.environ.get(AGENT_PID_VARIABLE))


_CONSEQUENCE = "_multigpu_consequence"


def mark_consequence(error: BaseException) -> None:
    """Note that ``error`` is the consequence of another rank's failure, which the one who saw
    it knows better than its message says (a collective that timed out waiting for a rank
    stopped by SIGSTOP: "Timed out waiting 10000ms")."""
    with contextlib.suppress(AttributeError, TypeError):  # an exception type with __slots__
        setattr(error, _CONSEQUENCE, True)


def is_consequence(error: BaseException | None) -> bool:
    """True for a collective that failed because its peer went away (another rank's failure)
    or one marked so (``mark_consequence``); never for an error whose message is the whole story
    (``said_in_full``: it names the cause, whatever words of a lost connection it quotes)."""
    if error is None or getattr(error, "said_in_full", False):
        return False
    if getattr(error, _CONSEQUENCE, False):
        return True
    return any(marker in str(error) for marker in PEER_GONE_MARKERS)

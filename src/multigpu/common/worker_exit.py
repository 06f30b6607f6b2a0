"""How a worker of ``multigpu run`` ends on Ctrl-C or a refused input: quietly, in one line.

A terminal's Ctrl-C reaches the launcher, whose torch agent passes SIGINT on to every worker
(they run in sessions of their own): each printed a 30-line ``KeyboardInterrupt`` traceback,
110-140 lines in all for two ranks of ``multigpu train --model lm``. And a ``UsageError`` raised
before ``multigpu.init()`` (``FSDPStrategy(mesh_shape="tp=2")`` as its argument), or a full
disk during a save, printed a traceback per rank above the launcher's one-line summary.

``install()`` (called by ``import multigpu`` in a worker that ``multigpu run`` started) sets a
``sys.excepthook`` that takes only two uncaught exceptions, and only once nothing in the user's
code caught them (a script's own ``except KeyboardInterrupt`` runs as before):

- ``KeyboardInterrupt``, or any exception once SIGINT came (a collective whose peer was
  interrupted first fails too): no traceback; as SIGINT comes rank 0 names the newest complete
  checkpoint of each checkpoint directory opened in this process (``note_checkpoints``), and
  again at exit only if that changed (a script's own ``except KeyboardInterrupt`` saved one).
  At once, not at exit: a second Ctrl-C makes torch's agent leave while it waits for the
  workers, and the kernel then kills them (``PR_SET_PDEATHSIG``) before their exit. The
  process still ends by SIGINT, as Python does for an uncaught ``KeyboardInterrupt``; the
  launcher exits 130. SIGINT raises ``KeyboardInterrupt`` as Python's own handler does (ours
  notes it first), and only where the script set no handler of its own.
- an error whose message is the whole story (``MultiGPUError.said_in_full``: a ``UsageError``,
  a full disk): recorded in the error file the launcher reads (``multigpu.common.worker_error``),
  and not printed: the launcher's one-line summary says it (exit 2 for a usage error).

Everything else goes to the hook that was there before. Under plain ``torchrun`` nothing changes.

Environment variables read: ``MULTIGPU_AGENT_PID`` (set by ``multigpu run``), ``RANK``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
from collections.abc import Callable
from types import TracebackType

from multigpu.common import worker_error
from multigpu.errors import MultiGPUError

_notes: dict[str, Callable[[], str | None]] = {}
_installed: list[bool] = []
_interrupted: list[bool] = []
_said: list[str] = []  # the lines rank 0 said of a Ctrl-C


def note_checkpoints(key: str, describe: Callable[[], str | None]) -> None:
    """Name, on Ctrl-C, what ``describe()`` says (e.g. ``"last checkpoint: DIR (step 40)"``);
    one entry per ``key`` (a checkpoint directory), the latest kept."""
    _notes[key] = describe


def interrupted_line() -> str:
    """The line rank 0 prints when Ctrl-C stops it."""
    notes = []
    for describe in list(_notes.values()):
        try:
            note = describe()
        except Exception:  # a directory gone meanwhile: say nothing of it
            note = None
        if note:
            notes.append(note)
    what = "; ".join(notes) if notes else "no checkpoint was saved"
    return f"multigpu: rank 0 stopped by Ctrl-C (SIGINT); {what}"


def interrupted() -> bool:
    """Whether Ctrl-C (SIGINT) stopped this worker (through the handler ``install`` set)."""
    return bool(_interrupted)


def _on_sigint(signum: int, frame: object) -> None:
    first = not _interrupted
    _interrupted.append(True)
    if first:
        _say_interrupted()  # now: this process may not live to its exit (module doc)
    raise KeyboardInterrupt


def _say_interrupted() -> None:
    """Rank 0's line, unless it was said already as it is now."""
    if not _interrupted or os.environ.get("RANK", "0") != "0":
        return
    line = interrupted_line()
    if _said and _said[-1] == line:
        return
    _said.append(line)
    try:  # through sys.stderr: a live progress bar (rich) that redirects it clears its line first
        print(line, file=sys.stderr, flush=True)
    except (RuntimeError, ValueError, OSError):
        # The signal came in the middle of a print to stderr, whose buffer refuses a reentrant
        # write: straight to the file descriptor.
        data = (line + "\n").encode()
        with contextlib.suppress(OSError):
            while data:
                data = data[os.write(2, data) :]


def _recorded(error: BaseException) -> bool:
    """True once ``error`` is in the worker's error file (``with multigpu.init()`` wrote it as it
    left the block: kept, with the time it happened)."""
    path = os.environ.get(worker_error.ERROR_FILE_VARIABLE, "")
    if path and os.path.isfile(path) and os.path.getsize(path) > 0:
        return True
    return worker_error.record(error)


def _hook(
    previous: Callable[[type[BaseException], BaseException, TracebackType | None], object],
) -> Callable[[type[BaseException], BaseException, TracebackType | None], None]:
    def hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        if _interrupted or isinstance(error, KeyboardInterrupt):
            # Also what Ctrl-C caused: a collective whose peer was interrupted first.
            return  # rank 0 says what it means at exit (_say_interrupted)
        if isinstance(error, MultiGPUError) and error.said_in_full and _recorded(error):
            return  # the launcher prints it, once, for every rank
        previous(kind, error, tb)

    return hook


def install() -> bool:
    """Set the hook in a worker of ``multigpu run`` (once); True when set."""
    if _installed or not worker_error.launched_by_multigpu() or "LOCAL_RANK" not in os.environ:
        return False
    _installed.append(True)
    sys.excepthook = _hook(sys.excepthook)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not the user's own
        signal.signal(signal.SIGINT, _on_sigint)
    atexit.register(_say_interrupted)  # also when the ending was a SystemExit
    return True

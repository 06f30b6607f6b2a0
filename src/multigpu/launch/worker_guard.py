"""Run a worker so that it dies with its launcher: ``python -I -S worker_guard.py PROGRAM ARGS...``.

torch's elastic agent starts every worker in a session of its own (``start_new_session``), so
its SIGTERM-on-exit reaches them only while the agent lives: ``kill -9`` of ``multigpu run``
left the workers training, holding devices and writing checkpoints. Linux can tie a process to
its parent: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` survives ``execve`` (of a program that is not
set-user-ID), so this wrapper sets it and then becomes the worker by ``exec`` — the same pid,
the same arguments torch gave it, no process in between. ``MULTIGPU_AGENT_PID`` names the
launcher that started it: if that one is already gone (it died between the ``fork`` and the
``prctl``), the worker is not started at all. SIGKILL rather than SIGTERM: a SIGTERM'd worker
would try to save a checkpoint, a collective that cannot finish without the launcher's other
workers, and the promise is "dead within seconds"; the last committed checkpoint stays intact.

Where ``prctl`` does not exist (not Linux) the worker starts unguarded.

Run as a script with ``-I -S``: it imports nothing but the standard library (importing the
``multigpu`` package would import torch, a second time, in every worker).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
AGENT_PID_VARIABLE = "MULTIGPU_AGENT_PID"
"""Set by the launcher in its own environment, which the workers inherit."""


def die_with_parent() -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies. True when it could (Linux:
    elsewhere libc has no ``prctl``)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def parent_is_gone(environ: dict[str, str]) -> bool:
    """True when the launcher that started this worker died before ``die_with_parent`` ran."""
    expected = environ.get(AGENT_PID_VARIABLE, "")
    return expected.isdigit() and os.getppid() != int(expected)


def main(argv: list[str]) -> int:
    """Guard this process, then become ``argv[0]`` with ``argv[1:]``. Returns only on error."""
    if not argv:
        print("worker_guard: usage: worker_guard.py PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    die_with_parent()
    if parent_is_gone(dict(os.environ)):
        print("worker_guard: the launcher is gone; not starting the worker", file=sys.stderr)
        return 1
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        print(f"worker_guard: cannot run {argv[0]!r}: {e.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

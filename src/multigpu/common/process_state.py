"""Whether a process of this machine is stopped (SIGSTOP, Ctrl-Z), read the same way by the
launcher (``launch/stopped_workers.py``, its workers) and by a worker's hang watchdog (its peers
on the same host)."""

from __future__ import annotations


def is_stopped(pid: int) -> bool:
    """True when process ``pid`` is stopped by a signal (SIGSTOP, Ctrl-Z; Linux ``/proc``; False
    elsewhere, when it is gone, and when a tracer holds it: state ``t``, a debugger).

    Example:
        >>> import os
        >>> is_stopped(os.getpid())
        False
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode(errors="replace")
    except OSError:
        return False
    # "pid (comm) S ...": comm may hold spaces and parentheses; the state follows the last ")".
    state = stat.rsplit(")", 1)[-1].split()[:1]
    return state == ["T"]

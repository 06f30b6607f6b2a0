"""Workers that are stopped (SIGSTOP, Ctrl-Z) when another one fails.

A stopped process acts on no signal but SIGKILL: torch's agent, ending a failed job, sent its
SIGTERM to a stopped worker and waited the whole shutdown timeout (30 s) before SIGKILL, so the
run ended 30 s past ``--timeout``; and the summary blamed the rank whose collective timed out
waiting for it. Here, at each check of the workers, once one has ended with an error (seen
without reaping it: ``waitid(..., WNOWAIT)``, torch's own check reaps it next), the agent notes
the stopped ones (state ``T`` in ``/proc/PID/stat``) and lets them go on (SIGCONT), so that its
SIGTERM ends them at once; the summary line names them. A worker stopped while the others run
is left alone (someone may resume it), as is one a debugger holds (state ``t``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


def is_stopped(pid: int) -> bool:
    """True when process ``pid`` is stopped by a signal or a tracer (Linux ``/proc``; False
    elsewhere or when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode(errors="replace")
    except OSError:
        return False
    # "pid (comm) S ...": comm may hold spaces and parentheses; the state follows the last ")".
    state = stat.rsplit(")", 1)[-1].split()[:1]
    return state == ["T"]


def failed(pid: int) -> bool:
    """True when child ``pid`` has ended with an error or a signal, leaving it to be reaped."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except (OSError, AttributeError):  # not our child, gone, or no waitid (not POSIX)
        return False
    if info is None:
        return False
    return info.si_code != os.CLD_EXITED or info.si_status != 0


@dataclass
class StoppedWorkers:
    """The ranks found stopped when the agent ended the workers (global rank → pid)."""

    found: dict[int, int] = field(default_factory=dict)

    def release_if_failed(self, pids_by_rank: Mapping[int, int]) -> None:
        """When a worker of ``pids_by_rank`` (global rank → pid) failed, note the stopped ones
        and send each SIGCONT."""
        if not any(failed(pid) for pid in pids_by_rank.values()):
            return
        for rank, pid in pids_by_rank.items():
            if pid and is_stopped(pid):
                self.found[rank] = pid
                with contextlib.suppress(OSError):  # gone meanwhile
                    os.kill(pid, signal.SIGCONT)

    def line(self, timeout_s: float, others: Iterable[int]) -> str:
        """The run's one line when some workers were stopped; ``others``: the other failed ranks.

        Example:
            >>> StoppedWorkers({1: 4242}).line(10, [0]).replace(socket.gethostname(), "HOST")
            'rank 1 on HOST (pid 4242) was stopped (SIGSTOP or Ctrl-Z): it took no part in the \
collectives, which timed out after --timeout 10 s (1 other rank stopped too); resume it with \
SIGCONT, or find what stopped it'
        """
        ranks = sorted(self.found)
        named = ", ".join(f"rank {r}" for r in ranks)
        pids = ", ".join(str(self.found[r]) for r in ranks)
        rest = len(set(others) - set(ranks))
        also = f" ({rest} other rank{'s' if rest > 1 else ''} stopped too)" if rest else ""
        verb = "was" if len(ranks) == 1 else "were"
        return (
            f"{named} on {socket.gethostname()} (pid {pids}) {verb} stopped (SIGSTOP or Ctrl-Z): "
            f"it took no part in the collectives, which timed out after --timeout "
            f"{timeout_s:g} s{also}; resume it with SIGCONT, or find what stopped it"
        )

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

from multigpu.common.process_state import is_stopped


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
        """The run's one line when some workers were stopped; ``others``: the other failed ranks
        (those whose collectives waited for the stopped ones).

        Example:
            >>> StoppedWorkers({1: 4242}).line(10, [0]).replace(socket.gethostname(), "HOST")
            'rank 1 on HOST (pid 4242) was stopped (SIGSTOP or Ctrl-Z): the collectives of rank \
0, which waited for it, timed out after --timeout 10 s; resume a stopped worker with SIGCONT, or \
find what stopped it'
        """
        ranks = sorted(self.found)
        named = ", ".join(f"rank {r}" for r in ranks)
        pids = ", ".join(str(self.found[r]) for r in ranks)
        waited = sorted(set(others) - set(ranks))
        verb, it = ("was", "it") if len(ranks) == 1 else ("were", "them")
        whose = f"of rank {', '.join(map(str, waited))}, which waited for {it}, " if waited else ""
        return (
            f"{named} on {socket.gethostname()} (pid {pids}) {verb} stopped (SIGSTOP or Ctrl-Z): "
            f"the collectives {whose}timed out after --timeout {timeout_s:g} s; resume a "
            "stopped worker with SIGCONT, or find what stopped it"
        )

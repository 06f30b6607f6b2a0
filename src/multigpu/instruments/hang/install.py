"""Recording into a ``CollectiveLog`` (``multigpu.instruments.hang.recorder``) the calls of the
tap on ``torch.distributed`` (``multigpu.runtime.collective_taps``), only while a run is watched:
``install`` (``start_watchdog``, at ``multigpu.init``) to ``uninstall`` (the Context's teardown,
``HangHook.on_teardown``); the tap puts torch's own functions back when its last listener goes.
"""

from __future__ import annotations

from multigpu.instruments.hang.recorder import CollectiveLog
from multigpu.runtime import collective_taps


def active_log() -> CollectiveLog | None:
    """The log ``install`` created, or None when recording is off."""
    for listener in collective_taps.listeners():
        if isinstance(listener, CollectiveLog):
            return listener
    return None


def install(trace_path: str | None = None) -> CollectiveLog:
    """Record ``torch.distributed``'s calls into one process-wide log, until the matching
    ``uninstall`` (the watchdog's ``stop``, at the Context's teardown). A second call before
    then shares the first one's log (a Context inside another: the tap counts its listens).

    With ``trace_path`` the last calls are also kept in that file (see ``read_trace``).
    """
    log = active_log() or CollectiveLog(trace_path=trace_path)
    collective_taps.listen(log)
    return log


def uninstall() -> None:
    """End one ``install``; after the last one nothing is recorded."""
    log = active_log()
    if log is not None:
        collective_taps.unlisten(log)

"""The hang explainer: record collectives, watch for a stall, say who waits where and why."""

from multigpu.hang.explain import explain
from multigpu.hang.recorder import CollectiveLog, active_log, install, uninstall
from multigpu.hang.watchdog import Watchdog, start_watchdog

__all__ = [
    "CollectiveLog",
    "Watchdog",
    "active_log",
    "explain",
    "install",
    "start_watchdog",
    "uninstall",
]

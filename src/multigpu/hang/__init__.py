"""The hang explainer: record collectives, watch for a stall, say who waits where and why."""

from multigpu.hang.explain import explain
from multigpu.hang.peers import report_lost_peers
from multigpu.hang.recorder import CollectiveLog, active_log, install, uninstall
from multigpu.hang.watchdog import Watchdog, start_watchdog

__all__ = [
    "CollectiveLog",
    "Watchdog",
    "active_log",
    "explain",
    "install",
    "report_lost_peers",
    "start_watchdog",
    "uninstall",
]

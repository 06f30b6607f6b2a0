"""Recording into a ``CollectiveLog`` (``multigpu.instruments.hang.recorder``) by wrapping the
collectives of ``torch.distributed``, only while a run is watched: ``install`` (``start_watchdog``,
at ``multigpu.init``) to ``uninstall`` (the Context's teardown, ``HangHook.on_teardown``), which
puts torch's own functions back.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch.distributed as tdist

from multigpu.instruments.hang.recorder import CollectiveLog, tensors_of

WRAPPED = (
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "barrier",
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "scatter_object_list",
    "send",
    "recv",
    "monitored_barrier",
)
"""The ``torch.distributed`` functions recorded."""


_LOG: CollectiveLog | None = None
_USERS = 0
"""The runs recording now (``install`` minus ``uninstall``): a Context inside another shares
the outer one's log, and the wrappers go when the last one ends."""
_WRAPPERS: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {}
"""``{name: (torch's function, our wrapper)}`` while installed."""


def active_log() -> CollectiveLog | None:
    """The log ``install`` created, or None when recording is off."""
    return _LOG


def install(trace_path: str | None = None) -> CollectiveLog:
    """Wrap ``torch.distributed``'s collectives to record into one process-wide log, until the
    matching ``uninstall`` (the watchdog's ``stop``, at the Context's teardown). A second call
    before then shares the first one's log.

    With ``trace_path`` the last calls are also kept in that file (see ``read_trace``).
    """
    global _LOG, _USERS
    _USERS += 1
    if _LOG is not None:
        return _LOG
    log = CollectiveLog(trace_path=trace_path)
    for name in WRAPPED:
        original = getattr(tdist, name, None)
        if original is not None:
            wrapper = _wrap(log, name, original)
            _WRAPPERS[name] = (original, wrapper)
            setattr(tdist, name, wrapper)
    _LOG = log
    return log


def uninstall() -> None:
    """End one ``install``; the last one gives ``torch.distributed`` its functions back (a
    function someone else replaced ours with since is left as it is)."""
    global _LOG, _USERS
    if _USERS == 0:
        return
    _USERS -= 1
    if _USERS:
        return
    for name, (original, wrapper) in _WRAPPERS.items():
        if getattr(tdist, name, None) is wrapper:
            setattr(tdist, name, original)
    _WRAPPERS.clear()
    _LOG = None


def _wrap(log: CollectiveLog, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        with log.record(name, tensors_of(args, kwargs)):
            return original(*args, **kwargs)

    return recorded

"""One tap on ``torch.distributed``: its collective and point-to-point functions (``TAPPED``) and
``Work.wait`` wrapped once, process-wide, while anyone listens; every listener is told when a
call begins and ends.

Two listen, each from its own Context hook, for as long as the Context lives: the hang
explainer's ``CollectiveLog`` (``multigpu.instruments.hang.install``, from ``multigpu.init`` to
the teardown) and the collective-wait clock of ``ctx.throughput()``
(``multigpu.throughput.wait``). A listener added twice (a Context inside another) counts twice;
it is told nothing more after its last ``unlisten``, and the last listener's ``unlisten`` gives
torch its functions back (one replaced again since, by someone else, is left as it is). So the
order in which the two stop does not matter.

Only the main thread's outermost call is an event: ``all_gather_object`` calls ``all_gather``,
and a call made from a background thread (a heartbeat, an async checkpoint) is no step's wait
and no call the main thread is stuck in; both pass straight through.

What no tap sees: names bound before the tap (``from torch.distributed import all_reduce``),
collectives called from C++ (DDP's reducer) and functional collectives (tensor parallel's
``DTensor`` redistributions, ``torch.distributed._functional_collectives``); and ``NOT_TAPPED``.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch.distributed as tdist

TAPPED = (
    # collectives
    "all_reduce",
    "all_reduce_coalesced",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "barrier",
    "monitored_barrier",
    # point to point
    "send",
    "recv",
    "batch_isend_irecv",
    # objects
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
)
"""The ``torch.distributed`` functions that communicate: every one the strategies, their torch
engines (DDP, FSDP2, pipelining) and multigpu itself call (``tests/strategies/
test_collective_coverage.py`` fails on one missing)."""

NOT_TAPPED = ("isend", "irecv")
"""The communicating functions left as they are: ``P2POp`` accepts only torch's own ``isend``
and ``irecv`` (the pipeline hands them to it, and ``batch_isend_irecv`` calls them); what they
start is waited for in ``Work.wait``, which is tapped."""

WAIT = "Work.wait"
"""The event name of ``Work.wait`` (an async call's end: FSDP2's gathers, the pipeline's
receives), tapped beside ``TAPPED``."""


class Listener(Protocol):
    """What a tap tells: a call's beginning and end."""

    def begin(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The call ``name`` (a ``TAPPED`` name or ``WAIT``) begins with these arguments; what
        this returns is given back to ``end``."""

    def end(self, token: Any, error: BaseException | None) -> None:
        """The call ``begin`` returned ``token`` for ended (``error``: what it raised)."""


class Tap:
    """Wraps ``targets`` (``(owner, attribute name)`` pairs) while it has a listener; a call is
    told by its attribute name (``Class.name`` for a class's).

    Example:
        >>> import types
        >>> class Count:
        ...     def begin(self, name, args, kwargs):
        ...         return name
        ...     def end(self, token, error):
        ...         print("ended", token)
        >>> space = types.SimpleNamespace(ping=lambda: "pong")
        >>> tap, count = Tap([(space, "ping")]), Count()
        >>> tap.listen(count)
        >>> space.ping()
        ended ping
        'pong'
        >>> tap.unlisten(count)
        >>> space.ping()
        'pong'
    """

    def __init__(self, targets: Sequence[tuple[Any, str]]) -> None:
        self._targets = list(targets)
        self._counts: list[list[Any]] = []  # [listener, listens - unlistens], in listen order
        self._listeners: tuple[Listener, ...] = ()  # what a call tells (read once per call)
        self._wrapped: list[tuple[Any, str, Callable[..., Any], Callable[..., Any]]] = []
        """``(owner, name, the original, our wrapper)`` while installed."""
        self._inside = False  # in a tapped call of the main thread
        self._main = threading.main_thread().ident

    def listeners(self) -> tuple[Listener, ...]:
        """The listeners now, in the order they came."""
        return self._listeners

    def listen(self, listener: Listener) -> None:
        """``listener`` is told every call until its matching ``unlisten`` (the first listener
        installs the wrappers)."""
        for entry in self._counts:
            if entry[0] is listener:
                entry[1] += 1
                return
        self._counts.append([listener, 1])
        self._listeners = tuple(entry[0] for entry in self._counts)
        if len(self._counts) == 1:
            self._install()

    def unlisten(self, listener: Listener) -> None:
        """End one ``listen`` of ``listener`` (none left: a no-op); the last listener's last one
        removes the wrappers."""
        for i, entry in enumerate(self._counts):
            if entry[0] is listener:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._counts[i]
                    self._listeners = tuple(e[0] for e in self._counts)
                    if not self._counts:
                        self._uninstall()
                return

    def _install(self) -> None:
        for owner, name in self._targets:
            fn = getattr(owner, name, None)
            if fn is not None and not getattr(fn, "__multigpu_tap__", False):
                event = f"{owner.__name__}.{name}" if isinstance(owner, type) else name
                wrapper = self.wrap(event, fn)
                setattr(owner, name, wrapper)
                self._wrapped.append((owner, name, fn, wrapper))

    def _uninstall(self) -> None:
        for owner, name, fn, wrapper in reversed(self._wrapped):
            if getattr(owner, name, None) is wrapper:
                setattr(owner, name, fn)
        self._wrapped.clear()

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, its main-thread outermost calls told to the listeners as ``name``."""
        get_ident = threading.get_ident

        @functools.wraps(fn)
        def tapped(*args: Any, **kwargs: Any) -> Any:
            listeners = self._listeners
            if self._inside or not listeners or get_ident() != self._main:
                return fn(*args, **kwargs)
            self._inside = True
            try:
                tokens = []
                for listener in listeners:
                    tokens.append(listener.begin(name, args, kwargs))
                try:
                    result = fn(*args, **kwargs)
                except BaseException as error:
                    for i in range(len(listeners) - 1, -1, -1):  # the last to begin ends first
                        listeners[i].end(tokens[i], error)
                    raise
                for i in range(len(listeners) - 1, -1, -1):
                    listeners[i].end(tokens[i], None)
                return result
            finally:
                self._inside = False

        tapped.__multigpu_tap__ = True  # type: ignore[attr-defined]
        return tapped


# ``Work`` is a pybind class whose attributes can be replaced (FSDP checks isinstance(work,
# Work), so the objects themselves cannot be wrapped).
TAP = Tap([*((tdist, name) for name in TAPPED), (tdist.Work, "wait")])
"""This process's tap (``torch.distributed`` is process-wide)."""


def listen(listener: Listener) -> None:
    """``TAP.listen``: ``listener`` hears ``torch.distributed``'s calls until ``unlisten``."""
    TAP.listen(listener)


def unlisten(listener: Listener) -> None:
    """``TAP.unlisten``: end one ``listen``."""
    TAP.unlisten(listener)


def listeners() -> tuple[Listener, ...]:
    """``TAP.listeners()``: who hears ``torch.distributed``'s calls now."""
    return TAP.listeners()

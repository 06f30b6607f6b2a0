"""How long the main thread waits on communication: the numerator of the collective-wait share.

Two sources, neither a profiler:

- **Python-level collectives** (``install()``): the ``torch.distributed`` functions in ``TIMED``
  and ``Work.wait`` are wrapped while a Context of several processes lives (its teardown calls
  ``uninstall()``, which puts torch's functions back); the time the *main thread* spends inside
  them is added up (a nested call — ``all_gather_object`` calls ``all_gather`` — counts once). This
  is what FSDP2 waits on (its all-gathers and reduce-scatters go through
  ``dist.all_gather_single`` / ``dist.reduce_scatter_single`` and ``Work.wait``), the pipeline's
  sends and receives (``batch_isend_irecv`` and ``Work.wait``), a loss's ``num_items``
  all-reduce and the gradient norm's.
- **DDP's gradient all-reduce** runs in C++ (its reducer) where no wrapper sees it; it overlaps
  the backward pass, and what is left when the last gradient is computed is the exposed wait:
  ``DDPTail`` times the last ``register_post_accumulate_grad_hook`` of the step to the end of
  ``backward`` (on CUDA, with two CUDA events on the current stream, read later).

What it misses: collectives called through names bound before ``install()`` (``from
torch.distributed import all_reduce``) or from C++ other than DDP's; waits on other threads; and
on CUDA every Python-level wait (NCCL calls return at once; the GPU waits, not the thread), so
on CUDA only DDP's tail is measured.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as tdist
from torch import nn

TIMED = (
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
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
    "send",
    "recv",
    "batch_isend_irecv",
    "all_gather_object",
    "broadcast_object_list",
)
"""The ``torch.distributed`` functions whose time on the main thread counts as waiting."""


class WaitClock:
    """Seconds the main thread spent in ``TIMED`` calls and ``Work.wait`` since the start."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._depth = 0
        self._main = threading.main_thread().ident

    def timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, its time on the main thread added to ``seconds``."""

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self._depth or threading.get_ident() != self._main:
                return fn(*args, **kwargs)
            self._depth += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
                self._depth -= 1

        wrapper.__multigpu_wait__ = True  # type: ignore[attr-defined]
        return wrapper


CLOCK = WaitClock()
"""This process's clock (the wrappers are process-wide, as ``torch.distributed`` is)."""

_USERS = 0
"""The Contexts timing now (``install`` minus ``uninstall``); the wrappers go with the last."""
_WRAPPED: list[tuple[Any, str, Callable[..., Any], Callable[..., Any]]] = []
"""``(owner, name, torch's function, our wrapper)`` while installed."""


def install() -> WaitClock:
    """Wrap ``TIMED`` and ``Work.wait`` (once, however many Contexts ask) until the matching
    ``uninstall``; the clock they feed."""
    global _USERS
    _USERS += 1
    if _USERS > 1:
        return CLOCK
    # ``Work`` is a pybind class: its attributes can be replaced (FSDP checks
    # isinstance(work, Work), so the objects themselves cannot be wrapped).
    work = tdist.distributed_c10d.Work
    targets = [(tdist, name) for name in TIMED] + [(work, "wait")]
    for owner, name in targets:
        fn = getattr(owner, name, None)
        if fn is not None and not getattr(fn, "__multigpu_wait__", False):
            wrapper = CLOCK.timed(fn)
            setattr(owner, name, wrapper)
            _WRAPPED.append((owner, name, fn, wrapper))
    return CLOCK


def uninstall() -> None:
    """End one ``install``; the last one gives torch its functions back (one replaced again
    since, by someone else, is left as it is)."""
    global _USERS
    if _USERS == 0:
        return
    _USERS -= 1
    if _USERS:
        return
    for owner, name, fn, wrapper in reversed(_WRAPPED):
        if getattr(owner, name, None) is wrapper:
            setattr(owner, name, fn)
    _WRAPPED.clear()


class DDPTail:
    """The exposed part of DDP's gradient all-reduce: from the step's last gradient to the end of
    ``backward`` (see the module doc). ``seconds()`` adds up the finished steps' tails."""

    def __init__(self, model: nn.Module, cuda: bool) -> None:
        self.cuda = cuda
        self._last = 0.0  # perf_counter at the latest gradient (CPU)
        self._event: torch.cuda.Event | None = None  # the latest gradient's event (CUDA)
        self._pending: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._cpu_seconds = 0.0
        self._handles = [
            p.register_post_accumulate_grad_hook(self._gradient)
            for p in model.parameters()
            if p.requires_grad
        ]

    def _gradient(self, _: torch.Tensor) -> None:
        if self.cuda:
            if self._event is None:
                self._event = torch.cuda.Event(enable_timing=True)
            self._event.record()  # re-recorded by each gradient: the last one stays
        else:
            self._last = time.perf_counter()

    def backward_ended(self) -> None:
        """``backward`` returned (call right after it)."""
        if self.cuda:
            if self._event is not None:
                end = torch.cuda.Event(enable_timing=True)
                end.record()
                self._pending.append((self._event, end))
                self._event = None
        elif self._last:
            self._cpu_seconds += time.perf_counter() - self._last
            self._last = 0.0

    def seconds(self) -> float:
        """The tails so far; on CUDA this waits for the last one's event (progress-line time)."""
        if self._pending:
            self._pending[-1][1].synchronize()
            self._cpu_seconds += sum(a.elapsed_time(b) / 1e3 for a, b in self._pending)
            self._pending.clear()
        return self._cpu_seconds

    def remove(self) -> None:
        """Take the hooks off the parameters."""
        for handle in self._handles:
            handle.remove()

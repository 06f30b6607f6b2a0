"""Recording every collective of this process: sequence number, op, shapes, dtype, call site.

``install()`` wraps the collectives of ``torch.distributed`` (the user's calls, multigpu's and
any library's go through them) so that each call is numbered and remembered with the Python line
that made it; ``ctx.backward`` adds a record for the backward pass, whose DDP gradient
all-reduce runs in C++ and cannot be wrapped. The watchdog reads these records when a rank stops
making progress. The cost is a Python wrapper and a short stack walk per collective.

Environment variables read: none.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from types import FrameType
from typing import Any

import torch
import torch.distributed as tdist

from multigpu.hang.trace import TRACE_SLOT

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

_LIBRARY_DIRS = tuple(
    os.path.dirname(m.__file__) + os.sep
    for m in (torch, sys.modules[__name__.split(".")[0]])
    if m.__file__
)


@dataclass
class Call:
    """One collective (or backward pass) of this rank."""

    seq: int
    op: str
    site: str
    shapes: list[list[int]] = field(default_factory=list)
    dtype: str = ""
    started: float = 0.0
    ended: float | None = None
    failed: str | None = None
    """The exception that ended the call (e.g. gloo's timeout), None when it returned."""

    def describe(self) -> str:
        """``all_reduce #12 float32[4, 3] at train.py:40 in step()``."""
        shapes = ", ".join("[" + ", ".join(map(str, s)) + "]" for s in self.shapes)
        what = f" {self.dtype}{shapes}" if shapes else ""
        return f"{self.op} #{self.seq}{what} at {self.site}"


def user_site(frame: FrameType | None) -> str:
    """``file.py:LINE in function()`` of the innermost frame outside torch and multigpu."""
    fallback = None
    while frame is not None:
        filename = frame.f_code.co_filename
        here = f"{os.path.basename(filename)}:{frame.f_lineno} in {frame.f_code.co_name}()"
        if fallback is None:
            fallback = here
        if not filename.startswith(_LIBRARY_DIRS) and not filename.startswith("<"):
            return here
        frame = frame.f_back
    return fallback or "?"


def _tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, list | tuple):
            found.extend(v for v in value if isinstance(v, torch.Tensor))
    return found[:4]


class CollectiveLog:
    """The last ``size`` calls of this process, the one in flight, and counts per call site."""

    def __init__(self, size: int = 64, trace_path: str | None = None) -> None:
        self.recent: collections.deque[Call] = collections.deque(maxlen=size)
        self._size = size
        # A fixed-size ring file (one slot per call, rewritten in place with pwrite): it
        # survives a crash that leaves no chance to write anything, e.g. gloo aborting on a
        # collective mismatch, and the launcher reads it to explain the failure.
        self._trace_fd = (
            os.open(trace_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            if trace_path
            else None
        )
        self.site_counts: collections.Counter[str] = collections.Counter()
        self.in_flight: Call | None = None
        self.count = 0
        # Time spent outside collectives (computing, loading data): a straggler has more of it,
        # while the others spend the difference waiting inside collectives.
        self.busy_s = 0.0
        self.steps = 0
        self._last_end: float | None = None
        self._depth = threading.local()
        self._lock = threading.Lock()

    @contextmanager
    def record(self, op: str, tensors: list[torch.Tensor] | None = None) -> Iterator[None]:
        """Record the block as one call (nested calls, e.g. inside all_gather_object, are not)."""
        depth = getattr(self._depth, "value", 0)
        if depth or threading.current_thread() is not threading.main_thread():
            yield  # an inner call of a recorded one, or a background thread (checkpoint saves)
            return
        site = user_site(sys._getframe(2))
        tensors = tensors or []
        now = time.monotonic()
        with self._lock:
            if self._last_end is not None:
                self.busy_s += now - self._last_end
            self.steps += op.startswith("backward")
            self.count += 1
            call = Call(
                seq=self.count,
                op=op,
                site=site,
                shapes=[list(t.shape) for t in tensors],
                dtype=str(tensors[0].dtype).removeprefix("torch.") if tensors else "",
                started=now,
            )
            self.recent.append(call)
            self.site_counts[f"{op} at {site}"] += 1
            self.in_flight = call
        self._trace(call)
        self._depth.value = depth + 1
        try:
            yield
        except BaseException as e:
            # A call that raised (a timeout, a lost peer) did not finish: say so in the trace,
            # or the launcher's summary would call a timed-out collective "finished".
            call.failed = type(e).__name__
            raise
        finally:
            self._depth.value = depth
            call.ended = self._last_end = time.monotonic()
            with self._lock:
                if self.in_flight is call:
                    self.in_flight = None
            self._trace(call)

    def _trace(self, call: Call) -> None:
        if self._trace_fd is None:
            return
        line = json.dumps(
            {
                "seq": call.seq,
                "op": call.op,
                "site": call.site,
                "shapes": call.shapes[:2],
                "dtype": call.dtype,
                "done": call.ended is not None and call.failed is None,
                "failed": call.failed,
            }
        ).encode()[: TRACE_SLOT - 1]
        try:
            os.pwrite(
                self._trace_fd,
                line.ljust(TRACE_SLOT - 1) + b"\n",
                (call.seq % self._size) * TRACE_SLOT,
            )
        except OSError:
            self._trace_fd = None  # a full or vanished disk must not stop training

    def snapshot(self) -> dict[str, Any]:
        """A JSON-ready copy (taken from the watchdog thread while the main thread may wait)."""
        with self._lock:
            now = time.monotonic()
            flight = self.in_flight
            return {
                "count": self.count,
                "in_flight": None
                if flight is None
                else {**asdict(flight), "waited_s": round(now - flight.started, 1)},
                "recent": [asdict(c) for c in list(self.recent)[-10:]],
                "site_counts": dict(self.site_counts),
            }


_LOG: CollectiveLog | None = None
_ORIGINALS: dict[str, Callable[..., Any]] = {}


def active_log() -> CollectiveLog | None:
    """The log ``install`` created, or None when recording is off."""
    return _LOG


def install(trace_path: str | None = None) -> CollectiveLog:
    """Wrap ``torch.distributed``'s collectives to record into one process-wide log (idempotent).

    With ``trace_path`` the last calls are also kept in that file (see ``read_trace``).
    """
    global _LOG
    if _LOG is not None:
        return _LOG
    log = CollectiveLog(trace_path=trace_path)
    for name in WRAPPED:
        original = getattr(tdist, name, None)
        if original is None:
            continue
        _ORIGINALS[name] = original
        setattr(tdist, name, _wrap(log, name, original))
    _LOG = log
    return log


def uninstall() -> None:
    """Put torch.distributed's own functions back."""
    global _LOG
    for name, original in _ORIGINALS.items():
        setattr(tdist, name, original)
    _ORIGINALS.clear()
    _LOG = None


def _wrap(log: CollectiveLog, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        with log.record(name, _tensors(args, kwargs)):
            return original(*args, **kwargs)

    return recorded

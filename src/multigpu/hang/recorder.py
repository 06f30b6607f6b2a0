"""Recording every collective of this process: sequence number, op, shapes, dtype, call site.

``install()`` wraps the collectives of ``torch.distributed`` (the user's calls, multigpu's and
any library's go through them) so that each call is numbered and remembered with the Python line
that made it; ``ctx.backward`` adds a record for the backward pass, whose DDP gradient
all-reduce runs in C++ and cannot be wrapped. The watchdog reads these records when a rank stops
making progress. The cost is a Python wrapper and a short stack walk per collective, kept to a
few microseconds: ``ctx.backward`` pays it at every step (see benchmarks/RESULTS.md).

Environment variables read: none.
"""

from __future__ import annotations

import collections
import functools
import json
import logging
import mmap
import os
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from types import CodeType, FrameType, TracebackType
from typing import Any

import torch
import torch.distributed as tdist

from multigpu.hang.trace import TRACE_SLOT

log = logging.getLogger(__name__)

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
_NOT_USER = (*_LIBRARY_DIRS, "<")
"""Where a call site is not the user's: torch, multigpu, and code without a file."""

_SITES: dict[tuple[CodeType, int], str] = {}
"""``user_site`` strings by (code, line): a training loop has a handful of call sites."""
_SITES_MAX = 4096

_DONE_AT = len(b'{"done": ')
"""Where a trace line's ``false`` becomes ``true `` when its call returns (one small write)."""

_UNRECORDED: AbstractContextManager[None] = nullcontext()


@dataclass(slots=True)
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
    first = frame
    while frame is not None:
        if not frame.f_code.co_filename.startswith(_NOT_USER):
            return _site(frame.f_code, frame.f_lineno)
        frame = frame.f_back
    return "?" if first is None else _site(first.f_code, first.f_lineno)


def _site(code: CodeType, line: int) -> str:
    site = _SITES.get((code, line))
    if site is None:
        site = f"{os.path.basename(code.co_filename)}:{line} in {code.co_name}()"
        if len(_SITES) < _SITES_MAX:
            _SITES[(code, line)] = site
    return site


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
        # A fixed-size ring file (one slot per call, rewritten in place): it survives a crash
        # that leaves no chance to write anything, e.g. gloo aborting on a collective mismatch,
        # and the launcher reads it to explain the failure.
        self._trace = _open_trace(trace_path, size * TRACE_SLOT) if trace_path else None
        self.site_counts: collections.Counter[tuple[str, str]] = collections.Counter()
        """Calls per (op, call site); ``snapshot`` names them ``"op at site"``."""
        self._tails: dict[tuple[Any, ...], bytes] = {}  # a trace line's JSON after "seq"
        self.in_flight: Call | None = None
        self.count = 0
        # Time spent outside collectives (computing, loading data): a straggler has more of it,
        # while the others spend the difference waiting inside collectives.
        self.busy_s = 0.0
        self.steps = 0
        self._last_end: float | None = None
        self._inside = False  # in a recorded call; only the main thread records, so no lock
        self._lock = threading.Lock()  # the main thread's changes against the watchdog's reads

    def record(
        self, op: str, tensors: list[torch.Tensor] | None = None
    ) -> AbstractContextManager[None]:
        """Record the block as one call (nested calls, e.g. inside all_gather_object, are not).

        Example:
            >>> log = CollectiveLog()
            >>> with log.record("barrier"):
            ...     pass
            >>> log.recent[-1].describe().startswith("barrier #1 at ")
            True
        """
        if threading.current_thread() is not threading.main_thread() or self._inside:
            return _UNRECORDED  # an inner call of a recorded one, or a background thread
        return _Recording(self, op, tensors)

    def _start(self, op: str, tensors: list[torch.Tensor] | None, frame: FrameType) -> Call:
        site = user_site(frame)
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
                shapes=[list(t.shape) for t in tensors] if tensors else [],
                dtype=str(tensors[0].dtype).removeprefix("torch.") if tensors else "",
                started=now,
            )
            self.recent.append(call)
            self.site_counts[(op, site)] += 1
            self.in_flight = call
        self._trace_call(call)
        self._inside = True
        return call

    def _end(self, call: Call, error: BaseException | None) -> None:
        self._inside = False
        call.ended = self._last_end = time.monotonic()
        self.in_flight = None  # one assignment: the watchdog reads either the call or None
        if error is not None:
            # A call that raised (a timeout, a lost peer) did not finish: say so in the trace,
            # or the launcher's summary would call a timed-out collective "finished".
            call.failed = type(error).__name__
            self._trace_call(call)
        elif self._trace is not None:
            at = (call.seq % self._size) * TRACE_SLOT + _DONE_AT
            self._trace[at : at + 5] = b"true "

    def _trace_call(self, call: Call) -> None:
        """Write ``call``'s line into its slot: ``"done"`` first, so that ``_end`` can flip it."""
        if self._trace is None:
            return
        key = (call.op, call.site, call.dtype, *map(tuple, call.shapes[:2]))
        tail = self._tails.get(key)
        if tail is None:
            tail = json.dumps(
                {"op": call.op, "site": call.site, "shapes": call.shapes[:2], "dtype": call.dtype}
            ).encode()[1:]
            if len(self._tails) < _SITES_MAX:
                self._tails[key] = tail
        failed = b"null" if call.failed is None else json.dumps(call.failed).encode()
        done = b"true " if call.ended is not None and call.failed is None else b"false"
        line = b'{"done": %s, "failed": %s, "seq": %d, %s' % (done, failed, call.seq, tail)
        at = (call.seq % self._size) * TRACE_SLOT
        self._trace[at : at + TRACE_SLOT] = line[: TRACE_SLOT - 1].ljust(TRACE_SLOT - 1) + b"\n"

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
                "site_counts": {f"{op} at {site}": n for (op, site), n in self.site_counts.items()},
            }


def _open_trace(path: str, length: int) -> mmap.mmap | None:
    """The trace file ``path`` mapped into memory, ``length`` bytes; None when it cannot be.

    Written through a shared mapping, not ``pwrite``: a write is then a memory copy into the
    page cache, which outlives the process like a written file does, while every ``pwrite`` to
    a disk file also updates its modification time — a filesystem journal entry at every step
    (about 7 µs each on ext4, twice per step). The blocks are written once here, so that a
    full disk fails now, with the trace turned off, and never under the mapping later.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError as e:
        log.info("no collective trace file (%s): %s", path, e)
        return None
    try:
        os.pwrite(fd, bytes(length), 0)
        return mmap.mmap(fd, length)
    except (OSError, ValueError) as e:  # a full disk, a filesystem without shared mappings
        log.info("no collective trace file (%s): %s", path, e)
        return None
    finally:
        os.close(fd)  # the mapping keeps the file


class _Recording:
    """``with log.record(...)``: the call starts at ``__enter__`` and ends at ``__exit__``.

    A class rather than a generator-based context manager: ``ctx.backward`` enters one at every
    step, and this costs a fraction of ``contextlib.contextmanager``'s machinery.
    """

    __slots__ = ("_call", "_log", "_op", "_tensors")

    def __init__(self, log: CollectiveLog, op: str, tensors: list[torch.Tensor] | None) -> None:
        self._log, self._op, self._tensors = log, op, tensors
        self._call: Call | None = None

    def __enter__(self) -> None:
        self._call = self._log._start(self._op, self._tensors, sys._getframe(1))
        self._tensors = None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._call is not None:
            self._log._end(self._call, error)


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

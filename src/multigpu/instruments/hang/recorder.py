"""Recording every collective of this process: sequence number, op, shapes, dtype, call site.

``multigpu.instruments.hang.install`` makes a log a listener of the tap on ``torch.distributed``
(``multigpu.runtime.collective_taps``: the user's calls, multigpu's and any library's go through
it) so that each call is numbered and remembered here with the Python line that made it, while a
run is watched; ``ctx.backward`` adds a record for
the backward pass, whose DDP gradient all-reduce runs in C++ and cannot be wrapped. The watchdog
reads these records when a rank stops making progress. The cost is a Python wrapper and a short
stack walk per collective, kept to a few microseconds: ``ctx.backward`` pays it at every step
(see benchmarks/RESULTS.md).
"""

from __future__ import annotations

import collections
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

from multigpu.instruments.hang.trace import TRACE_SLOT
from multigpu.runtime.collective_taps import WAIT

log = logging.getLogger(__name__)

_LIBRARY_DIRS = tuple(
    os.path.dirname(m.__file__) + os.sep
    for m in (torch, sys.modules[__name__.split(".")[0]])
    if m.__file__
)
_NOT_USER = (*_LIBRARY_DIRS, "<")
"""Where a call site is not the user's: torch, multigpu, and code without a file."""

_SITES: dict[tuple[int, int], tuple[CodeType, str]] = {}
"""``user_site`` strings by (id of the code, instruction offset): a loop has a handful of sites.

Keyed by the code's identity, not by the code object, whose hash is computed afresh from its
constants, recursively (every nested function of a script's ``main()``): ~1 µs in a tight loop,
~20 µs between a training step's forward and backward passes, where the caches are cold. And by
the frame's instruction offset rather than its line, which Python finds by scanning the code's
line table. The code object is kept with its string, so its id cannot be reused while cached.
"""
_SITES_MAX = 4096

_DONE_AT = len(b'{"done": ')
"""Where a trace line's ``false`` becomes ``true `` when its call returns (one small write)."""

_HEAD = b'{"done": false, "failed": %s, "seq": %%-20d, '
"""A trace line's start until its call returns; ``seq`` padded to a fixed width (any 64-bit
count fits), so that a call kind's whole line is one preformatted ``%`` away (``_line_format``)."""

_get_ident = threading.get_ident
_monotonic = time.monotonic

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


def user_site(frame: FrameType | None) -> str:
    """``file.py:LINE in function()`` of the innermost frame outside torch and multigpu."""
    first = frame
    while frame is not None:
        code = frame.f_code
        if not code.co_filename.startswith(_NOT_USER):
            hit = _SITES.get((id(code), frame.f_lasti))  # a training step's case: inline
            return _site(frame, code) if hit is None else hit[1]
        frame = frame.f_back
    return "?" if first is None else _site(first, first.f_code)


def _site(frame: FrameType, code: CodeType) -> str:
    key = (id(code), frame.f_lasti)
    hit = _SITES.get(key)
    if hit is not None:
        return hit[1]
    site = f"{os.path.basename(code.co_filename)}:{frame.f_lineno} in {code.co_name}()"
    if len(_SITES) < _SITES_MAX:
        _SITES[key] = (code, site)
    return site


def _line_format(
    op: str, site: str, shapes: list[list[int]], dtype: str, failed: str | None = None
) -> bytes:
    """A call's whole trace line, running or ``failed``: ``TRACE_SLOT`` bytes once ``%`` puts
    its seq in (a failed name is at most a class name: the head keeps its length or grows)."""
    head = _HEAD % json.dumps(failed).encode().replace(b"%", b"%%")
    room = TRACE_SLOT - 1 - len(head % 0)
    tail = json.dumps({"op": op, "site": site, "shapes": shapes[:2], "dtype": dtype}).encode()
    return head + (tail[1:][:room].ljust(room) + b"\n").replace(b"%", b"%%")


def tensors_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The first tensors among a call's arguments (also inside lists): what its record shows."""
    found: list[torch.Tensor] = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, list | tuple):
            found.extend(v for v in value if isinstance(v, torch.Tensor))
    return found[:4]


class CollectiveLog:
    """The last ``size`` calls of this process, the one in flight, and counts per call site.

    Only the main thread writes it and the watchdog thread only reads it, so there is no lock:
    each change is one assignment or one C-level container operation, whole under the GIL, and
    ``snapshot`` copies the containers in one C call each. A call is kept as a plain list, the
    fields of ``Call`` in order (one bytecode to build, where a dataclass runs its ``__init__``);
    ``recent`` and ``in_flight`` hand out ``Call`` objects.
    """

    def __init__(self, size: int = 64, trace_path: str | None = None) -> None:
        self._recent: collections.deque[list[Any]] = collections.deque(maxlen=size)
        self._size = size
        # A fixed-size ring file (one slot per call, rewritten in place): it survives a crash
        # that leaves no chance to write anything, e.g. gloo aborting on a collective mismatch,
        # and the launcher reads it to explain the failure.
        self._trace = _open_trace(trace_path, size * TRACE_SLOT) if trace_path else None
        self.site_counts: collections.Counter[tuple[str, str]] = collections.Counter()
        """Calls per (op, call site); ``snapshot`` names them ``"op at site"``."""
        # Per kind of call (op, site, dtype, shapes): its trace line format, whether it is a
        # backward pass (a training step) and its (op, site). A loop makes a handful of kinds.
        self._kinds: dict[tuple[Any, ...], tuple[bytes, bool, tuple[str, str]]] = {}
        self._flight: list[Any] | None = None
        self.count = 0
        # Time spent outside collectives (computing, loading data) since the first backward pass:
        # a straggler has more of it, while the others spend the difference waiting inside
        # collectives.
        self.busy_s = 0.0
        self.steps = 0
        self._last_end: float | None = None
        self._inside = False  # in a recorded call (the main thread's alone)
        self._main = threading.main_thread().ident

    @property
    def recent(self) -> list[Call]:
        """The last calls, oldest first."""
        return [Call(*fields) for fields in list(self._recent)]

    @property
    def in_flight(self) -> Call | None:
        """The call running now, None between calls."""
        fields = self._flight  # one read: the watchdog sees either the call or None
        return None if fields is None else Call(*fields)

    def record(
        self, op: str, tensors: list[torch.Tensor] | None = None
    ) -> AbstractContextManager[None]:
        """Record the block as one call (nested calls, e.g. inside all_gather_object, are not).

        Example:
            >>> log = CollectiveLog()
            >>> with log.record("barrier"):
            ...     pass
            >>> log.recent[-1].op, log.recent[-1].seq
            ('barrier', 1)
        """
        if self._inside or _get_ident() != self._main:
            return _UNRECORDED  # an inner call of a recorded one, or a background thread
        return _Recording(self, op, tensors)

    def call(self, op: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` recorded as one call, like ``with record(op): fn(...)``.

        What ``ctx.backward`` uses at every step: no context manager object, no ``__enter__``
        and ``__exit__`` calls (each Python call costs a microsecond or more in a training step).

        Example:
            >>> log = CollectiveLog()
            >>> log.call("barrier", max, 1, 2), log.recent[-1].op
            (2, 'barrier')
        """
        if self._inside or _get_ident() != self._main:
            return fn(*args, **kwargs)  # an inner call of a recorded one, or a background thread
        fields = self._start(op, None, sys._getframe(1))
        try:
            result = fn(*args, **kwargs)
        except BaseException as error:
            self._end(fields, error)
            raise
        self._end(fields, None)
        return result

    def begin(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any] | None:
        """A call of the tap on ``torch.distributed`` begins (``collective_taps.Listener``): it
        is recorded, unless it is a ``Work.wait`` (an async call's end; the call was recorded)
        or runs inside a recorded backward pass."""
        if name == WAIT or self._inside or _get_ident() != self._main:
            return None
        return self._start(name, tensors_of(args, kwargs), sys._getframe(1))

    def end(self, token: list[Any] | None, error: BaseException | None) -> None:
        """The call ``begin`` returned ``token`` for ended."""
        if token is not None:
            self._end(token, error)

    def _start(self, op: str, tensors: list[torch.Tensor] | None, frame: FrameType) -> list[Any]:
        site = user_site(frame)
        now = _monotonic()
        if tensors:
            shapes = [list(t.shape) for t in tensors]
            dtype = str(tensors[0].dtype).removeprefix("torch.")
            kind: tuple[Any, ...] = (op, site, dtype, *map(tuple, shapes[:2]))
        else:
            shapes, dtype = [], ""
            kind = (op, site)
        known = self._kinds.get(kind)
        if known is None:
            known = (_line_format(op, site, shapes, dtype), op.startswith("backward"), (op, site))
            if len(self._kinds) < _SITES_MAX:
                self._kinds[kind] = known
        if self._last_end is not None and self.steps:
            # From the first training step on: what comes before is setup, not a step (DDP's
            # construction alone imports torch._dynamo, ~1 s, on every rank alike).
            self.busy_s += now - self._last_end
        self.steps += known[1]
        self.count = seq = self.count + 1
        fields = [seq, op, site, shapes, dtype, now, None, None]  # Call's fields
        self._recent.append(fields)
        self.site_counts[known[2]] += 1
        self._flight = fields
        if self._trace is not None:
            at = (seq % self._size) * TRACE_SLOT
            self._trace[at : at + TRACE_SLOT] = known[0] % seq
        self._inside = True
        return fields

    def _end(self, fields: list[Any], error: BaseException | None) -> None:
        self._inside = False
        fields[6] = self._last_end = _monotonic()  # Call.ended
        self._flight = None
        if error is not None:
            # A call that raised (a timeout, a lost peer) did not finish: say so in the trace,
            # or the launcher's summary would call a timed-out collective "finished".
            fields[7] = type(error).__name__  # Call.failed
        if self._trace is None:
            return
        seq, op, site, shapes, dtype, _, _, failed = fields
        at = (seq % self._size) * TRACE_SLOT
        if failed is None:
            self._trace[at + _DONE_AT : at + _DONE_AT + 5] = b"true "
        else:
            self._trace[at : at + TRACE_SLOT] = _line_format(op, site, shapes, dtype, failed) % seq

    def snapshot(self) -> dict[str, Any]:
        """A JSON-ready copy (taken from the watchdog thread while the main thread may wait)."""
        now = _monotonic()
        flight = self.in_flight
        recent = self.recent[-10:]
        counts = dict(self.site_counts)  # one C call, like list() of the deque in ``recent``
        return {
            "count": self.count,
            "in_flight": None
            if flight is None
            else {**asdict(flight), "waited_s": round(now - flight.started, 1)},
            "recent": [asdict(c) for c in recent],
            "site_counts": {f"{op} at {site}": n for (op, site), n in counts.items()},
        }


def _open_trace(path: str, length: int) -> mmap.mmap | None:
    """The trace file ``path`` mapped into memory, ``length`` bytes; None when it cannot be.

    Written through a shared mapping, not ``pwrite``: a write is then a memory copy into the
    page cache, which outlives the process like a written file does, while every ``pwrite`` to
    a disk file also updates its modification time — a filesystem journal entry at every step
    (about 7 µs each on ext4, twice per step). The blocks are written once here, so that a
    full disk fails now, with the trace turned off, and never under the mapping later.
    """
    fd = None
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.pwrite(fd, bytes(length), 0)
        return mmap.mmap(fd, length)
    except (OSError, ValueError) as e:  # no directory, a full disk, no shared mappings
        log.info("no collective trace file (%s): %s", path, e)
        return None
    finally:
        if fd is not None:
            os.close(fd)  # the mapping keeps the file


class _Recording:
    """``with log.record(...)``: the call starts at ``__enter__`` and ends at ``__exit__``.

    A class rather than a generator-based context manager: every wrapped collective enters one,
    and this costs a fraction of ``contextlib.contextmanager``'s machinery.
    """

    __slots__ = ("_call", "_log", "_op", "_tensors")

    def __init__(self, log: CollectiveLog, op: str, tensors: list[torch.Tensor] | None) -> None:
        self._log, self._op, self._tensors = log, op, tensors
        self._call: list[Any] | None = None

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

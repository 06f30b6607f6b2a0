"""oneTBB's allocator in this process: keep the large blocks FSDP frees, for its next unit.

``multigpu run`` preloads oneTBB's allocator into CPU workers (``launch.cpu_allocator``). It keeps
freed blocks of up to 64 MiB for reuse, and gives larger ones back to the system at once. At
200M parameters each of FSDP's gathered units, unsharded gradients and reduce-scatter buffers is
just above 64 MiB, so every one was mapped and faulted in again, several times per step. FSDP
reuses the same few sizes unit after unit: keeping blocks from 64 MiB up as well
(``TBBMALLOC_SET_HUGE_SIZE_THRESHOLD``, tbbmalloc's public API) made FSDP's step at 200M
parameters on 2 CPU processes 2.5x faster (3.4-3.7 s instead of 7.5-9.6 s), at a peak of 2.7 GiB
instead of 2.2 (DDP's: 3.5-4.3 GiB); at 50M it changes nothing (benchmarks/RESULTS.md, "Shipped
since: oneTBB's allocator, ..."). DDP keeps them from its second optimizer step on (the optimizer's
temporaries and gloo's, the same every step): 1.7-1.9 s a step at 200M instead of 3.0, at a peak
of 3.54 GiB instead of 3.47. Not from the start: DDP rebuilds its buckets in the second forward,
and the first ones would stay kept for good (0.75 GiB more at 200M).

The setting is process-wide, so it lasts only while a model is set up: the strategy's
teardown restores tbbmalloc's default and gives the kept blocks back. tbbmalloc also drops its
caches by itself when the system refuses it memory. Without tbbmalloc (glibc's ``malloc``, or
another preloaded allocator) everything here does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

KEEP_FROM_BYTES = 64 << 20
"""Freed blocks of this size and above are kept too (tbbmalloc keeps those below by default)."""
_SET_HUGE_SIZE_THRESHOLD = 2  # AllocationModeParam in tbb/scalable_allocator.h
_CLEAN_ALL_BUFFERS = 0  # ScalableAllocationCmd
_DEFAULT_THRESHOLD = 1 << 40  # its maxHugeSize on 64-bit systems, the default (larger: ignored)


@functools.cache  # a process's malloc is fixed when it starts
def loaded_tbbmalloc() -> ctypes.CDLL | None:
    """oneTBB's allocator when it is this process's ``malloc`` (preloaded), else None."""
    try:
        with open("/proc/self/maps") as fh:
            maps = fh.read()
    except OSError:  # not Linux
        return None
    if "libtbbmalloc_proxy" not in maps:
        return None
    path = next(
        (line.split(None, 5)[-1] for line in maps.splitlines()
         if line.rstrip().endswith("/libtbbmalloc.so.2")),
        None,
    )  # fmt: skip
    if path is None:
        return None
    lib = ctypes.CDLL(path.strip())  # already mapped: this only takes a reference
    lib.scalable_allocation_mode.argtypes = [ctypes.c_int, ctypes.c_ssize_t]
    lib.scalable_allocation_mode.restype = ctypes.c_int
    lib.scalable_allocation_command.argtypes = [ctypes.c_int, ctypes.c_void_p]
    lib.scalable_allocation_command.restype = ctypes.c_int
    return lib


def keep_large_blocks(min_bytes: int = KEEP_FROM_BYTES) -> Callable[[], None] | None:
    """Have tbbmalloc keep freed blocks of ``min_bytes`` and more for reuse.

    Returns:
        The undo (restore the default, give the kept blocks back), or None where tbbmalloc is
        not this process's allocator or refused the setting.
    """
    lib = loaded_tbbmalloc()
    if lib is None:
        return None
    if lib.scalable_allocation_mode(_SET_HUGE_SIZE_THRESHOLD, min_bytes) != 0:
        log.debug("tbbmalloc refused a huge-size threshold of %d bytes", min_bytes)
        return None

    def undo() -> None:
        lib.scalable_allocation_mode(_SET_HUGE_SIZE_THRESHOLD, _DEFAULT_THRESHOLD)
        lib.scalable_allocation_command(_CLEAN_ALL_BUFFERS, None)

    return undo


class KeptBlocks:
    """A strategy's hold on ``keep_large_blocks``: ``keep`` once, ``release`` at teardown."""

    def __init__(self) -> None:
        self._undo: Callable[[], None] | None = None

    def keep(self) -> None:
        """Keep large freed blocks from now on (nothing where tbbmalloc is not in use)."""
        if self._undo is None:
            self._undo = keep_large_blocks()

    def release(self) -> None:
        """Restore tbbmalloc's default and give the kept blocks back, if kept."""
        if self._undo is not None:
            self._undo()
            self._undo = None

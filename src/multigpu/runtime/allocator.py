"""glibc's allocator under DDP on CPU processes: keep freed memory for the next step.

A DDP step on a CPU frees and allocates the same large tensors every step (gradients, the
optimizer's temporaries). glibc returns the freed top of its heap to the system as soon as more
than its trim threshold is free, and the next step faults those pages back in, zeroed by the
kernel: at 50M parameters 31-48k page faults per step, 130-160 ms of system time in a step of
~430-1000 ms, varying from run to run with how the allocations fall (``python
benchmarks/sizes.py --threads``, benchmarks/RESULTS.md, "Overhead and memory at three sizes").
With the mmap threshold at glibc's own ceiling (32 MiB) and a trim threshold of 1 GiB the same
steps fault 1-3k pages and spend 74-91 ms in the kernel; the peak RSS of DDP is unchanged
within 0.05 GiB (the memory is reused in the next step, not kept beside it).

Only DDP on CPU gets it: FSDP's gathered units are freed and gathered again within a step, and
keeping them raised its peak (1.88-1.94 GiB against 1.68-1.84 at 50M), while giving them back at
once (``MALLOC_MMAP_THRESHOLD_=131072``) made FSDP's step 2-3x slower. On GPUs the tensors are
not in glibc's heap.

The settings are process-wide: ``keep_freed_memory`` is counted (a Context inside another), and
the last ``restore`` puts glibc's initial thresholds back (128 KiB each; glibc's dynamic
adjustment of them stays off once set) and trims what was kept.

Environment variables read: ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``,
``MALLOC_TOP_PAD_``, ``MALLOC_MMAP_MAX_``, ``MALLOC_ARENA_MAX``, ``GLIBC_TUNABLES``: a user who
set any of them tuned the allocator, and it is left as they set it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform
import threading

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
KEEP_MMAP_THRESHOLD = 32 * 2**20
"""glibc's ceiling for its dynamic mmap threshold on 64-bit: larger blocks are still mapped."""
KEEP_TRIM_THRESHOLD = 2**30
"""Free memory at the top of the heap kept before glibc gives it back."""
GLIBC_DEFAULT_THRESHOLD = 128 * 1024
"""glibc's initial mmap and trim thresholds."""
USER_SETTINGS = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
    "MALLOC_ARENA_MAX",
    "GLIBC_TUNABLES",
)

_lock = threading.Lock()
_held = 0


def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc (``mallopt``, ``malloc_trim``); None elsewhere."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def keep_freed_memory() -> bool:
    """Set glibc to keep freed memory for reuse (see the module docstring); whether it did.

    Does nothing (False) where the user set an allocator variable or the C library is not glibc.
    Each True must be matched by one ``restore()``.
    """
    global _held
    if any(os.environ.get(name) for name in USER_SETTINGS):
        return False
    libc = _glibc()
    if libc is None:
        return False
    with _lock:
        if _held == 0:
            ok = libc.mallopt(M_MMAP_THRESHOLD, KEEP_MMAP_THRESHOLD) == 1
            ok = libc.mallopt(M_TRIM_THRESHOLD, KEEP_TRIM_THRESHOLD) == 1 and ok
            if not ok:
                log.debug("mallopt refused the thresholds; glibc's defaults stay")
                return False
        _held += 1
    return True


def restore() -> None:
    """Undo one ``keep_freed_memory()``; the last one puts glibc's initial thresholds back and
    gives the memory kept free back to the system (``malloc_trim``)."""
    global _held
    with _lock:
        if _held == 0:
            return
        _held -= 1
        if _held == 0:
            libc = _glibc()
            if libc is not None:
                libc.mallopt(M_MMAP_THRESHOLD, GLIBC_DEFAULT_THRESHOLD)
                libc.mallopt(M_TRIM_THRESHOLD, GLIBC_DEFAULT_THRESHOLD)
                libc.malloc_trim(0)

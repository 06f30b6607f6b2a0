"""The memory allocator of CPU workers: oneTBB's scalable allocator where it is installed.

Why. On CPU processes every tensor a training step frees and makes again (gradients, AdamW's
temporaries, FSDP's gathered units and reduce-scatter buffers: 8-64 MiB each at 50-200M
parameters) goes through glibc's ``malloc``. glibc either maps such a block afresh each time (every
page faulted in again: tens to hundreds of thousands of page faults per step) or keeps it in a
heap that fragments: FSDP's heap at 50M parameters grew to 1.4-1.8 GiB for 0.55 GiB of live tensors,
above DDP's 1.37 GiB, so sharding saved nothing. oneTBB's allocator (``libtbbmalloc``, from the
``tbb`` package on PyPI) keeps freed large blocks for reuse by size and returns the rest: FSDP at
50M then peaks at 0.81 GiB with steps no slower, and DDP's steps stop varying with the page
faults (benchmarks/RESULTS.md, "Shipped since: oneTBB's allocator, ..."). Intel's launcher for
PyTorch on CPU preloads an allocator (jemalloc or tcmalloc) for the same reason; torchrun does not.

How. ``multigpu run`` preloads it into CPU workers (``LD_PRELOAD``, both libraries by absolute
path: the proxy that replaces ``malloc`` needs the allocator, which is not on the loader's path).
The launcher itself, and GPU workers, keep the system's allocator.

Environment variables read: ``MULTIGPU_CPU_ALLOCATOR`` — ``auto`` (the default: tbb for CPU
workers where the ``tbb`` package is installed, else the system's), ``tbb`` (required: an error
when it is missing; also for GPU workers), ``system`` (glibc's ``malloc``); ``LD_PRELOAD``: when the
user set it, ``auto`` leaves the workers with it alone (it may name an allocator already), and
``tbb`` puts the allocator before it.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from multigpu.errors import UsageError

VARIABLE = "MULTIGPU_CPU_ALLOCATOR"
CHOICES = ("auto", "tbb", "system")
LIBRARIES = ("libtbbmalloc.so.2", "libtbbmalloc_proxy.so.2")
"""The allocator, then the proxy that puts it in place of ``malloc``, ``free`` and the rest."""


@dataclass(frozen=True)
class AllocatorChoice:
    """What the workers' allocator will be, and the variables that make it so."""

    name: str
    """``tbb`` or ``system``."""
    asked: str
    """What ``MULTIGPU_CPU_ALLOCATOR`` asked for: ``auto``, ``tbb`` or ``system``."""
    env: Mapping[str, str]
    """Variables for the workers (``LD_PRELOAD``), empty for ``system``."""
    note: str = ""
    """Why the default was not applied, when that is worth a line (else empty)."""


def tbb_libraries() -> tuple[str, ...] | None:
    """Absolute paths of ``LIBRARIES`` from the installed ``tbb`` distribution, or None when it
    is not installed (or not on Linux, the only system whose wheels have them)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        files = importlib.metadata.distribution("tbb").files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    found: dict[str, str] = {}
    for entry in files:
        if entry.name in LIBRARIES:
            path = os.path.normpath(os.path.abspath(str(entry.locate())))
            if os.path.isfile(path):
                found[entry.name] = path
    if len(found) != len(LIBRARIES):
        return None
    return tuple(found[name] for name in LIBRARIES)


def choose_allocator(
    environ: Mapping[str, str], *, device: str, libraries: tuple[str, ...] | None
) -> AllocatorChoice:
    """The workers' allocator for ``device`` (``cpu`` or ``cuda``) under ``environ``.

    ``libraries`` is ``tbb_libraries()`` (given, so that the choice is a pure function).

    Raises:
        UsageError: ``MULTIGPU_CPU_ALLOCATOR`` is not one of ``CHOICES``, or is ``tbb`` where the
            ``tbb`` package is not installed.
    """
    given = environ.get(VARIABLE, "").strip().lower() or "auto"
    if given not in CHOICES:
        raise UsageError(
            f"{VARIABLE}={environ.get(VARIABLE)!r}; expected one of {', '.join(CHOICES)} "
            "(auto: oneTBB's allocator for CPU workers where the tbb package is installed)"
        )
    if given == "system" or (given == "auto" and device != "cpu"):
        return AllocatorChoice("system", given, {})
    if libraries is None:
        if given == "tbb":
            raise UsageError(
                f"{VARIABLE}=tbb but the tbb package's allocator is not installed; "
                f"pip install tbb, or set {VARIABLE}=system"
            )
        return AllocatorChoice("system", given, {})  # no wheel for this platform, or --no-deps
    theirs = environ.get("LD_PRELOAD", "").strip()
    if theirs and given == "auto":
        note = (
            f"LD_PRELOAD is set ({theirs}): the workers keep it, without oneTBB's allocator "
            f"({VARIABLE}=tbb adds it)"
        )
        return AllocatorChoice("system", given, {}, note)
    preload = ":".join([*libraries, *filter(None, [theirs])])
    return AllocatorChoice("tbb", given, {"LD_PRELOAD": preload})

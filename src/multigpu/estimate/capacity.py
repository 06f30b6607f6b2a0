"""How much memory a rank has for its model: its GPU's free memory, or its share of CPU RAM.

On CPU processes the tightest of: this process's ``RLIMIT_AS`` / ``RLIMIT_DATA`` (minus what it
already maps), the cgroup's memory limit minus its usage, and ``MemAvailable`` — the last two
shared by the processes of the node. Each reading is a pure function of the text it parses, so
the choice is tested with recorded files.
"""

from __future__ import annotations

import resource
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

GIB = 2**30


@dataclass(frozen=True, kw_only=True)
class Capacity:
    """Bytes one rank can use, and what bounds it."""

    bytes: int
    source: str
    """What gave the figure, readable: ``"MemAvailable 22.1 GiB / 2 processes"``."""

    def __str__(self) -> str:
        return f"{self.bytes / GIB:.1f} GiB ({self.source})"


def meminfo_available(text: str) -> int | None:
    """``MemAvailable`` in bytes from ``/proc/meminfo``'s text.

    Example:
        >>> meminfo_available("MemTotal: 100 kB\\nMemAvailable:  2048 kB\\n")
        2097152
    """
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def status_kib(text: str, field: str) -> int:
    """A ``/proc/self/status`` field (``VmSize``, ``VmData``...) in bytes; 0 when absent.

    Example:
        >>> status_kib("VmSize:\\t  1024 kB\\n", "VmSize")
        1048576
    """
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def cgroup_room(limit: str | None, usage: str | None) -> int | None:
    """Bytes left under a cgroup memory limit (v2 ``memory.max`` / ``memory.current``).

    Example:
        >>> cgroup_room("1073741824\\n", "73741824\\n"), cgroup_room("max\\n", "1\\n")
        (1000000000, None)
    """
    if not limit or limit.strip() in ("max", "") or usage is None:
        return None
    value = int(limit.strip())
    if value >= 2**60:  # cgroup v1's "no limit"
        return None
    return max(0, value - int(usage.strip()))


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def cpu_capacity(
    local_processes: int,
    *,
    files: Mapping[str, str | None] | None = None,
    limits: Mapping[str, int] | None = None,
) -> Capacity:
    """One CPU process's share of memory (see the module doc).

    Args:
        local_processes: the processes of this node sharing its RAM.
        files: the texts of ``/proc/meminfo``, ``/proc/self/status`` and the cgroup's
            ``memory.max``/``memory.current`` (default: read them).
        limits: ``{"RLIMIT_AS": bytes, "RLIMIT_DATA": bytes}`` soft limits (default: this
            process's; ``resource.RLIM_INFINITY`` for none).

    Example:
        >>> cpu_capacity(2, files={"/proc/meminfo": "MemAvailable: 8388608 kB"}, limits={}).source
        'MemAvailable 8.0 GiB / 2 processes'
    """
    n = max(1, local_processes)
    if files is None:
        files = {
            path: _read(path)
            for path in (
                "/proc/meminfo",
                "/proc/self/status",
                "/sys/fs/cgroup/memory.max",
                "/sys/fs/cgroup/memory.current",
            )
        }
    if limits is None:
        limits = {
            name: resource.getrlimit(getattr(resource, name))[0]
            for name in ("RLIMIT_AS", "RLIMIT_DATA")
        }
    status = files.get("/proc/self/status") or ""
    found: list[Capacity] = []
    available = meminfo_available(files.get("/proc/meminfo") or "")
    if available is not None:
        found.append(
            Capacity(
                bytes=available // n,
                source=f"MemAvailable {available / GIB:.1f} GiB / {n} processes",
            )
        )
    room = cgroup_room(
        files.get("/sys/fs/cgroup/memory.max"), files.get("/sys/fs/cgroup/memory.current")
    )
    if room is not None:
        found.append(
            Capacity(
                bytes=room // n,
                source=f"cgroup memory limit, {room / GIB:.1f} GiB free / {n} processes",
            )
        )
    for name, used_field in (("RLIMIT_AS", "VmSize"), ("RLIMIT_DATA", "VmData")):
        limit = limits.get(name, resource.RLIM_INFINITY)
        if limit != resource.RLIM_INFINITY and limit > 0:
            left = max(0, limit - status_kib(status, used_field))
            found.append(
                Capacity(bytes=left, source=f"{name} {limit / GIB:.1f} GiB of this process")
            )
    if not found:
        return Capacity(bytes=0, source="unknown (no /proc/meminfo)")
    return min(found, key=lambda c: c.bytes)


def gpu_capacity(device: torch.device) -> Capacity:
    """The free memory of this rank's GPU (``torch.cuda.mem_get_info``)."""
    free, total = torch.cuda.mem_get_info(device)
    name = torch.cuda.get_device_name(device)
    return Capacity(
        bytes=int(free),
        source=f"{device} ({name}): {free / GIB:.1f} of {total / GIB:.1f} GiB free",
    )


def device_capacity(device: torch.device, local_processes: int) -> Capacity:
    """What one rank on ``device`` can hold: its GPU's free memory, or its share of RAM."""
    if device.type == "cuda":
        return gpu_capacity(device)
    return cpu_capacity(local_processes)

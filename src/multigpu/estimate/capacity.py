"""How much memory one rank has for its model: its GPU's free memory, or its share of CPU RAM.

On CPU processes the tightest of:

- this process's ``RLIMIT_DATA`` soft limit minus ``VmData`` (what the limit counts: private
  writable mappings, i.e. the heap and every tensor) and ``RLIMIT_AS`` minus ``VmSize``;
- the cgroup's memory limit (v2 ``memory.max``, v1 ``memory.limit_in_bytes``, the tightest along
  this process's cgroup path) minus its usage less reclaimable page cache, shared by the
  processes of this node;
- ``MemAvailable`` (``/proc/meminfo``) shared by the processes of this node.

``Capacity.source`` says which one bounded it. A worker asks about its own GPU with
``torch.cuda.mem_get_info`` (its CUDA context exists already, and that is exactly its device,
MIG and ``CUDA_VISIBLE_DEVICES`` resolved); the command line, which must not create a CUDA
context, reads ``multigpu.gpus`` (NVML, then nvidia-smi) instead: ``gpus_capacity``.

Every reading is a pure function of the text it parses, so the choice is tested with recorded
files; ``read_memory_files`` reads the real ones.
"""

from __future__ import annotations

import resource
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from multigpu.gpus.types import GPUInfo

GIB = 2**30
MIB = 2**20

CGROUP_ROOT = "/sys/fs/cgroup"
V2 = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory.stat")
"""The keys of a cgroup v2 limit, usage and statistics in ``files`` (the tightest cgroup's)."""
V1 = (
    "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    "/sys/fs/cgroup/memory/memory.usage_in_bytes",
    "/sys/fs/cgroup/memory/memory.stat",
)
"""The same for cgroup v1."""
_NO_LIMIT = 2**60  # cgroup v1 writes "no limit" as a page-rounded 2**63 - 1


@dataclass(frozen=True, kw_only=True)
class Capacity:
    """Bytes one rank can use, and what bounds it."""

    bytes: int
    """Memory this rank can still use for the model's training state."""
    source: str
    """What gave the figure, readable: ``"MemAvailable 22.1 GiB / 2 processes"``."""
    kind: str = "cpu"
    """``"cpu"`` (RAM of CPU processes) or ``"cuda"`` (a GPU's memory)."""

    def __str__(self) -> str:
        return f"{self.bytes / GIB:.1f} GiB ({self.source})"


def status_kib(text: str, field: str) -> int:
    """A ``/proc/self/status`` field (``VmSize``, ``VmData``...) in bytes; 0 when absent.

    Example:
        >>> status_kib("VmSize:\\t  1024 kB\\n", "VmSize")
        1048576
    """
    return _kib_field(text, field) or 0


def _kib_field(text: str, field: str) -> int | None:
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return None


def cgroup_room(limit: str | None, usage: str | None, stat: str | None = None) -> int | None:
    """Bytes left under a cgroup memory limit; None when there is no limit.

    Usage counts the page cache; its inactive part (``inactive_file``, v1's
    ``total_inactive_file``) is given back under pressure, so it counts as room.

    Example:
        >>> cgroup_room("1073741824\\n", "73741824\\n"), cgroup_room("max\\n", "1\\n")
        (1000000000, None)
        >>> cgroup_room("1000", "600", "anon 100\\ninactive_file 200\\n")
        600
    """
    if not limit or limit.strip() in ("max", "") or usage is None:
        return None
    value = int(limit.strip())
    if value >= _NO_LIMIT:
        return None
    reclaimable = 0
    for line in (stat or "").splitlines():
        key, _, number = line.partition(" ")
        if key in ("inactive_file", "total_inactive_file") and number.strip().isdigit():
            reclaimable = int(number)
    return max(0, value - max(0, int(usage.strip()) - reclaimable))


def cpu_capacity(
    local_processes: int,
    *,
    files: Mapping[str, str | None] | None = None,
    limits: Mapping[str, int] | None = None,
) -> Capacity:
    """One CPU process's share of memory: the tightest bound (see the module doc).

    Args:
        local_processes: the processes of this node sharing its RAM.
        files: texts by path: ``/proc/meminfo``, ``/proc/self/status`` and the cgroup's
            (keys ``V2`` or ``V1``); default: ``read_memory_files()``.
        limits: ``{"RLIMIT_AS": bytes, "RLIMIT_DATA": bytes}`` soft limits (default: this
            process's; absent or ``resource.RLIM_INFINITY``: none).

    Example:
        >>> cpu_capacity(2, files={"/proc/meminfo": "MemAvailable: 8388608 kB"}, limits={}).source
        'MemAvailable 8.0 GiB / 2 processes'
    """
    n = max(1, local_processes)
    shared = f"/ {n} process{'es' * (n > 1)}"
    files = read_memory_files() if files is None else files
    if limits is None:
        limits = {
            name: resource.getrlimit(getattr(resource, name))[0]
            for name in ("RLIMIT_AS", "RLIMIT_DATA")
        }
    found: list[Capacity] = []
    available = _kib_field(files.get("/proc/meminfo") or "", "MemAvailable")
    if available is not None:
        source = f"MemAvailable {available / GIB:.1f} GiB {shared}"
        found.append(Capacity(bytes=available // n, source=source))
    for keys in (V2, V1):
        room = cgroup_room(*(files.get(key) for key in keys))
        if room is not None:
            source = f"cgroup memory limit, {room / GIB:.1f} GiB free {shared}"
            found.append(Capacity(bytes=room // n, source=source))
    status = files.get("/proc/self/status") or ""
    for name, used_field in (("RLIMIT_DATA", "VmData"), ("RLIMIT_AS", "VmSize")):
        limit = limits.get(name, resource.RLIM_INFINITY)
        if limit != resource.RLIM_INFINITY and limit > 0:
            used = status_kib(status, used_field)
            source = (
                f"{name} {limit / GIB:.1f} GiB of this process, {used / GIB:.2f} GiB in use "
                f"({used_field})"
            )
            found.append(Capacity(bytes=max(0, limit - used), source=source))
    if not found:
        return Capacity(bytes=0, source="unknown: no /proc/meminfo, no limit found")
    return min(found, key=lambda c: c.bytes)


def read_memory_files(root: str = CGROUP_ROOT) -> dict[str, str | None]:
    """The texts ``cpu_capacity`` reads, from this machine (a missing file: None).

    The cgroup files are those of the tightest limit on this process's cgroup path (a limit
    may sit on any ancestor), under the keys ``V2`` / ``V1``.

    Example:
        >>> "/proc/meminfo" in read_memory_files()
        True
    """
    files: dict[str, str | None] = {
        path: _read(path) for path in ("/proc/meminfo", "/proc/self/status")
    }
    own = _read("/proc/self/cgroup") or ""
    for keys, controller in ((V2, ""), (V1, "memory")):
        base = Path(root, controller)
        chosen: tuple[str | None, ...] = (None, None, None)
        tightest: int | None = None
        for folder in _cgroup_folders(own, controller, base):
            texts = tuple(_read(str(folder / Path(key).name)) for key in keys)
            room = cgroup_room(*texts)
            if room is not None and (tightest is None or room < tightest):
                chosen, tightest = texts, room
        files.update(zip(keys, chosen, strict=True))
    return files


def _cgroup_folders(own: str, controller: str, base: Path) -> list[Path]:
    """This process's cgroup folder and its ancestors up to ``base`` (those that exist)."""
    relative = ""
    for line in own.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        # v2's line has no controllers ("0::/x"): "".split(",") == [""] matches controller "".
        if controller in controllers.split(","):
            relative = path.strip().lstrip("/")
    parts = [p for p in relative.split("/") if p and p != ".."]
    folders = [base.joinpath(*parts[:i]) for i in range(len(parts) + 1)]
    return [f for f in folders if f.is_dir()]


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def gpus_capacity(gpus: Sequence[GPUInfo], processes: int) -> Capacity | None:
    """The free memory per process on this machine's GPUs (one process per GPU), as the
    launcher would pick them: the ``processes`` GPUs with the most free memory, bounded by the
    least free of those. None when there are fewer GPUs than processes.

    Example:
        >>> from multigpu.gpus.types import GPUInfo
        >>> gpu = GPUInfo(index=0, logical_index=0, uuid="GPU-0", name="NVIDIA H100",
        ...               pci_bus_id="", memory_total_mib=81559, memory_free_mib=76800,
        ...               utilization_percent=0, visible_id="GPU-0")
        >>> gpus_capacity([gpu], 1).source
        'GPU 0: NVIDIA H100 79.6 GiB, 75.0 GiB free'
    """
    if processes < 1 or len(gpus) < processes:
        return None
    chosen = sorted(gpus, key=lambda g: -g.memory_free_mib)[:processes]
    least = min(chosen, key=lambda g: g.memory_free_mib)
    index = least.index if least.logical_index is None else least.logical_index
    free = least.memory_free_mib * MIB
    source = _gpu_source(index, least.name, least.memory_total_mib * MIB, free)
    if processes > 1:
        source += f" (the least free of {processes})"
    return Capacity(bytes=free, source=source, kind="cuda")


def device_capacity(device: torch.device, local_processes: int) -> Capacity:
    """What one rank on ``device`` can hold: its GPU's free memory (``torch.cuda.mem_get_info``,
    in a worker), or its share of RAM.

    Example:
        >>> device_capacity(torch.device("cpu"), 2).kind
        'cpu'
    """
    if device.type != "cuda":
        return cpu_capacity(local_processes)
    free, total = torch.cuda.mem_get_info(device)
    source = _gpu_source(device.index, torch.cuda.get_device_name(device), total, free)
    return Capacity(bytes=int(free), source=source, kind="cuda")


def _gpu_source(index: int | None, name: str, total: int, free: int) -> str:
    return f"GPU {index}: {name} {total / GIB:.1f} GiB, {free / GIB:.1f} GiB free"

"""Software and CPU checks: versions, torch's build and backends, cores and threads, /dev/shm.

Nothing here initialises CUDA: ``torch.version.cuda`` and ``torch.distributed.is_*_available``
are compile-time facts.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.distributed as dist

from multigpu.common.host import usable_cores
from multigpu.common.versions import local_versions
from multigpu.diagnostics.doctor.checks import Check, fail, ok, warn
from multigpu.errors import UsageError
from multigpu.launch.cpu_allocator import VARIABLE, choose_allocator, tbb_libraries

GiB = 1024**3
MiB = 1024**2
CPU_MAX = "/sys/fs/cgroup/cpu.max"
"""cgroup v2's CPU limit of this container (absent on cgroup v1 and outside Linux)."""
SHM_MIN_BYTES = GiB
"""Below this, /dev/shm is a WARN: Docker's default of 64 MiB breaks DataLoader workers
("bus error", "No space left on device") and NCCL's shared-memory transport."""


def torch_build() -> str:
    """What torch was built for: ``"CUDA 12.8"``, ``"ROCm 6.3"`` or ``"CPU-only"``."""
    hip = getattr(torch.version, "hip", None)
    if hip:
        return f"ROCm {hip}"
    if torch.version.cuda:
        return f"CUDA {torch.version.cuda}"
    return "CPU-only"


def version_facts() -> dict[str, str]:
    """This process's Python, torch, torch build and multigpu versions (compared across ranks)."""
    versions = local_versions()
    return {
        "python": versions["python"],
        "torch": versions["torch"],
        "torch build": torch_build(),
        "multigpu": versions["multigpu"],
    }


def software_checks() -> list[Check]:
    """Rows for Python, torch (and its build), multigpu and the process-group backends."""
    facts = version_facts()
    rows = [
        ok("software", "python", f"{facts['python']} ({sys.executable})"),
        ok("software", "torch", f"{facts['torch']}, {facts['torch build']} build"),
        ok("software", "multigpu", facts["multigpu"]),
    ]
    if not dist.is_available():
        rows.append(
            fail(
                "software",
                "backends",
                f"torch {torch.__version__} was built without torch.distributed",
                "install an official torch wheel (pip install torch), which has it",
            )
        )
        return rows
    found = {
        "gloo": dist.is_gloo_available(),
        "nccl": dist.is_nccl_available(),
        "mpi": dist.is_mpi_available(),
    }
    listed = ", ".join(f"{name} {'yes' if has else 'no'}" for name, has in found.items())
    if not found["gloo"]:
        rows.append(
            fail(
                "software",
                "backends",
                listed,
                "this torch has no gloo, which CPU training and multigpu's checks need; "
                "install an official torch wheel",
            )
        )
    else:
        rows.append(ok("software", "backends", listed))
    return rows


def thread_check(
    environ: Mapping[str, str], *, cores: int, torch_threads: int, local_processes: int
) -> Check:
    """Threads per process (``OMP_NUM_THREADS``, else torch's) against the cores: WARN on
    oversubscription. ``cores``: this process's affinity mask; ``local_processes``: training
    processes on this machine.
    """
    omp = environ.get("OMP_NUM_THREADS", "").strip()
    shown = f"OMP_NUM_THREADS={omp}" if omp else "OMP_NUM_THREADS unset"
    split = cores // local_processes or 1
    value = (
        f"{cores} cores; {local_processes} process(es) x {torch_threads} torch thread(s); {shown}"
    )
    fix = (
        f"export OMP_NUM_THREADS={split} (cores // processes), or launch with `multigpu run`, "
        "which sets it"
    )
    threads = int(omp) if omp.isdigit() and int(omp) > 0 else None
    if omp and threads is None:
        return warn(
            "cpu",
            "threads",
            value + " (not a whole number: ignored)",
            f"export OMP_NUM_THREADS={split}",
        )
    if local_processes > 1 and threads is None:
        return warn(
            "cpu",
            "threads",
            value + f": each process may start {cores} threads, "
            f"{local_processes * cores} on {cores} cores",
            fix,
        )
    total = (threads or torch_threads) * local_processes
    if total > cores:
        return warn("cpu", "threads", value + f": {total} threads on {cores} cores", fix)
    return ok("cpu", "threads", value)


def quota_check(cpu_max: str | None, *, cores: int) -> Check:
    """The container's CPU limit (cgroup v2 ``cpu.max``, "QUOTA PERIOD" or "max PERIOD"):
    WARN when it allows fewer CPUs than the cores torch and the launcher count.
    """
    parts = (cpu_max or "").split()
    if len(parts) != 2 or parts[0] == "max" or not all(p.isdigit() for p in parts):
        return ok("cpu", "CPU limit", "no cgroup CPU quota")
    cpus = int(parts[0]) / max(int(parts[1]), 1)
    value = f"cgroup quota {cpus:g} CPUs ({CPU_MAX}: {' '.join(parts)})"
    if cpus >= cores:
        return ok("cpu", "CPU limit", value)
    threads = max(int(cpus), 1)
    return warn(
        "cpu",
        "CPU limit",
        f"{value}, but {cores} cores are visible: torch and the launcher size their thread "
        f"pools to {cores}, and the quota throttles them",
        f"export OMP_NUM_THREADS={threads} (divided by the processes per node), or raise the "
        "container's CPU limit",
    )


def cpu_checks(environ: Mapping[str, str]) -> list[Check]:
    """The thread and CPU-limit checks for this process, with the machine's facts read here."""
    local = environ.get("LOCAL_WORLD_SIZE", "1")
    processes = int(local) if local.isdigit() and int(local) > 0 else 1
    cores = usable_cores()
    try:
        cpu_max: str | None = Path(CPU_MAX).read_text()
    except OSError:  # cgroup v1 or not Linux: no quota to read here
        cpu_max = None
    return [
        thread_check(
            environ,
            cores=cores,
            torch_threads=torch.get_num_threads(),
            local_processes=processes,
        ),
        quota_check(cpu_max, cores=cores),
        allocator_check(environ, tbb_libraries()),
    ]


def allocator_check(environ: Mapping[str, str], libraries: tuple[str, ...] | None) -> Check:
    """The allocator ``multigpu run`` gives CPU workers (``launch.cpu_allocator``): WARN when it
    is glibc's only because oneTBB's is missing on a system that has its wheel."""
    name = "allocator"  # the CPU workers': short, the table's check column stays narrow
    try:
        chosen = choose_allocator(environ, device="cpu", libraries=libraries)
    except UsageError as e:
        return fail("cpu", name, str(e), f"set {VARIABLE} to auto, tbb or system")
    if chosen.name == "tbb":
        return Check(
            group="cpu",
            name=name,
            status="OK",
            value="oneTBB's, preloaded into CPU workers by multigpu run",
            detail={"LD_PRELOAD": chosen.env["LD_PRELOAD"]},
        )
    if chosen.note:  # the user's LD_PRELOAD
        return ok("cpu", name, chosen.note)
    if chosen.asked == "system":
        return ok("cpu", name, f"glibc's malloc ({VARIABLE}=system)")
    if sys.platform.startswith("linux") and os.uname().machine == "x86_64":
        return warn(
            "cpu",
            name,
            "glibc's malloc: the tbb package is not installed, and glibc's heap keeps FSDP's "
            "freed units (at 50M parameters 1.7 GiB per rank where oneTBB's allocator peaks "
            "at 0.8)",
            "pip install tbb (a dependency of multigpu on Linux x86_64)",
        )
    return ok("cpu", name, "the system's malloc (no oneTBB wheel for this platform)")


def shm_check(size_bytes: int | None, free_bytes: int | None = None) -> Check:
    """/dev/shm's size: WARN below 1 GiB (or when it is missing), with the container fix."""
    fix = (
        "give the container more shared memory: docker run --shm-size=8g (or --ipc=host); "
        "Kubernetes: mount an emptyDir with medium: Memory at /dev/shm"
    )
    if size_bytes is None:
        return warn(
            "cpu", "/dev/shm", "missing: DataLoader workers and NCCL need shared memory", fix
        )
    shown = _size(size_bytes)
    if free_bytes is not None:
        shown += f" ({_size(free_bytes)} free)"
    if size_bytes < SHM_MIN_BYTES:
        return warn(
            "cpu",
            "/dev/shm",
            f"{shown}: below 1 GiB, DataLoader workers (num_workers > 0) and NCCL's "
            "shared-memory transport fail with bus errors or 'No space left on device'",
            fix,
        )
    return ok("cpu", "/dev/shm", shown)


def read_shm(path: str = "/dev/shm") -> tuple[int | None, int | None]:
    """(size, free) of the filesystem at ``path`` in bytes; (None, None) when it is missing."""
    if not Path(path).is_dir():
        return None, None
    try:
        stat = os.statvfs(path)
    except OSError:
        return None, None
    return stat.f_frsize * stat.f_blocks, stat.f_frsize * stat.f_bavail


def _size(n: int) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n // MiB} MiB"

"""CUDA runtime, NVIDIA driver and NCCL: are they there, and do they fit together; then each
visible GPU's free memory, utilisation and compute processes, and how the GPUs are linked
(NVLink or the PCIe path).

``torch.cuda.is_available()`` and the NCCL version need the CUDA driver loaded, which must not
happen in a process that later forks workers (see ``multigpu.gpus.torch_probe``): the doctor
asks a short-lived child (``cuda_facts_in_child``); a launched worker, which uses CUDA anyway,
asks itself (``torch_cuda_facts``). The driver's version and the newest CUDA it supports
(``DriverFacts``) come from ``multigpu.gpus.read_facts``: NVML, else nvidia-smi's CSV/XML query
modes — never from CUDA. The child gets the whole environment, so it sees the GPUs this
process would see (``CUDA_VISIBLE_DEVICES``...). The GPUs and their links come from
``read_facts`` too (NVML; nvidia-smi only where NVML cannot be loaded; torch in a child process
last), so this process never creates a CUDA context.
"""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from multigpu.diagnostics.doctor.checks import Check, fail, ok, skip, warn
from multigpu.gpus import DriverFacts, GPUFacts, GPUInfo, busy_reason
from multigpu.gpus.topology import link_meaning
from multigpu.gpus.visible import visible_devices

log = logging.getLogger(__name__)

CHILD_TIMEOUT_S = 60.0
"""How long the CUDA child may take (a hung driver must not hang the doctor)."""
INSTALL = "pick the command for your CUDA at https://pytorch.org/get-started/locally/"

_CHILD = (
    "import dataclasses, json; from multigpu.diagnostics.doctor.cuda import torch_cuda_facts; "
    "print(json.dumps(dataclasses.asdict(torch_cuda_facts())))"
)


@dataclass(frozen=True, kw_only=True)
class CudaFacts:
    """What torch.cuda says in a process that may initialise CUDA."""

    available: bool
    """``torch.cuda.is_available()``."""
    device_count: int
    """Devices torch sees (under that process's ``CUDA_VISIBLE_DEVICES``)."""
    nccl: str | None
    """NCCL's (or RCCL's) version, ``"2.27.3"``; None when torch has none."""
    why: str = ""
    """torch's warning when CUDA is not available ("driver too old" and the like)."""


def torch_cuda_facts() -> CudaFacts:
    """torch.cuda's answers in THIS process (initialises CUDA: workers and the child only)."""
    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
    nccl = None
    with contextlib.suppress(Exception):  # CPU-only builds have no NCCL bindings at all
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    return CudaFacts(
        available=available,
        device_count=torch.cuda.device_count() if available else 0,
        nccl=nccl,
        why=" ".join(str(caught[0].message).split())[:300] if caught else "",
    )


def cuda_facts_in_child(environ: Mapping[str, str]) -> CudaFacts | None:
    """Ask a child ``python`` for ``torch_cuda_facts()``; None when it failed or hung."""
    from multigpu.gpus.torch_probe import json_from_child

    answer = json_from_child(_CHILD, environ, CHILD_TIMEOUT_S, "CUDA child")
    try:
        return CudaFacts(**answer) if answer is not None else None
    except (KeyError, TypeError, ValueError) as e:
        log.debug("CUDA child failed: %s", e)
        return None


def _version(text: str | None) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text or "")[:2])


def driver_check(build_cuda: str | None, driver: DriverFacts | None, gpus: int) -> Check:
    """The driver's CUDA against torch's: FAIL on an older major version, WARN on a minor one.

    Example:
        >>> d = DriverFacts(version="535.54", cuda="12.2", source="nvml")
        >>> driver_check("12.8", d, 1).status, driver_check("11.8", d, 1).status
        ('WARN', 'OK')
    """
    if driver is None:
        if gpus and build_cuda:
            return fail(
                "cuda",
                "driver",
                f"{gpus} GPU(s) but no NVIDIA driver answers (NVML, nvidia-smi)",
                "install the NVIDIA driver (or run the container with --gpus all) and check "
                "that `nvidia-smi` works",
            )
        return skip("cuda", "driver", "no NVIDIA driver (NVML and nvidia-smi not found)")
    value = f"{driver.version}, supports CUDA {driver.cuda or '?'} (from {driver.source})"
    have, need = _version(driver.cuda), _version(build_cuda)
    if not build_cuda or not have or have >= need:
        return ok("cuda", "driver", value)
    fix = (
        f"upgrade the NVIDIA driver to one for CUDA {build_cuda}, or install a torch built for "
        f"CUDA {driver.cuda} or older ({INSTALL})"
    )
    if have[0] < need[0]:
        return fail("cuda", "driver", f"{value}; torch needs CUDA {build_cuda}", fix)
    return warn(
        "cuda",
        "driver",
        f"{value}; torch is built for {build_cuda} (minor-version "
        "compatibility: most kernels run, PTX JIT and the newest features fail)",
        fix,
    )


def cuda_checks(
    *,
    torch_version: str,
    build_cuda: str | None,
    build_hip: str | None,
    gpus: int,
    facts: CudaFacts | None,
    driver: DriverFacts | None,
) -> list[Check]:
    """Rows for the CUDA runtime, the driver and NCCL.

    ``build_cuda`` / ``build_hip`` are ``torch.version.cuda`` / ``.hip`` (both None: a CPU-only
    build); ``gpus`` counts the GPUs after ``CUDA_VISIBLE_DEVICES``; ``facts`` is None when
    torch.cuda was not asked or the child failed, ``driver`` None when no driver was found.
    """
    if not build_cuda and not build_hip:
        cpu_only = f"torch {torch_version} is a CPU-only build"
        runtime = (
            warn(
                "cuda",
                "runtime",
                f"{cpu_only} but {gpus} GPU(s) are here: training runs on the CPU",
                f"install torch built for CUDA: {INSTALL}",
            )
            if gpus
            else skip("cuda", "runtime", cpu_only)
        )
        return [
            runtime,
            driver_check(None, driver, gpus),
            skip("cuda", "NCCL", f"{cpu_only}: no NCCL (CPU processes use gloo)"),
        ]
    build = f"ROCm {build_hip}" if build_hip else f"CUDA {build_cuda}"
    return [
        _runtime_check(build, gpus, facts, driver),
        skip("cuda", "driver", f"{build} build: the NVIDIA driver check does not apply")
        if build_hip
        else driver_check(build_cuda, driver, gpus),
        _nccl_check(build, gpus, facts, "RCCL" if build_hip else "NCCL"),
    ]


def _runtime_check(
    build: str, gpus: int, facts: CudaFacts | None, driver: DriverFacts | None
) -> Check:
    if facts is not None and facts.available:
        return ok("cuda", "runtime", f"{build}, torch sees {facts.device_count} device(s)")
    if not gpus:
        return skip("cuda", "runtime", f"no GPU visible here (torch is a {build} build)")
    if facts is None:
        return fail(
            "cuda",
            "runtime",
            f"{gpus} GPU(s), but a child process asking torch.cuda failed or hung",
            "run `python -c 'import torch; torch.cuda.init()'` to see the error",
        )
    why = f": {facts.why}" if facts.why else ""
    fix = (
        "check that `nvidia-smi` works in this environment, CUDA_VISIBLE_DEVICES, and that a "
        "container runs with --gpus all"
    )
    older = driver is not None and _version(driver.cuda) < _version(build)
    if build.startswith("CUDA") and driver is not None and driver.cuda and older:
        fix = f"the driver supports CUDA {driver.cuda} only: upgrade it, or {INSTALL}"
    return fail(
        "cuda", "runtime", f"torch.cuda.is_available() is False with {gpus} GPU(s) here{why}", fix
    )


def _nccl_check(build: str, gpus: int, facts: CudaFacts | None, name: str) -> Check:
    if facts is not None and facts.nccl:
        return ok("cuda", name, f"{facts.nccl} (built into torch)")
    if not gpus:
        return skip("cuda", name, f"no GPU visible here: {name} is not used")
    if facts is None:
        return skip("cuda", name, "unknown: torch.cuda could not be asked (see runtime)")
    return fail(
        "cuda",
        name,
        f"this torch ({build}) has no {name}: GPUs cannot communicate",
        f"install an official torch wheel, which bundles {name}: {INSTALL}",
    )


def topology_check(links: Mapping[tuple[int, int], str], *, gpus: int) -> Check:
    """One row: how many GPU pairs use each kind of link (the matrix goes to the JSON).

    Example:
        >>> topology_check({(0, 1): "NV12"}, gpus=2).value
        'NV12 (NVLink) x1'
    """
    if gpus < 2:
        return skip("gpu", "topology", f"{gpus} GPU visible: no GPU-to-GPU links to show")
    if not links:
        return skip(
            "gpu", "topology", "how the GPUs are linked is not reported (NVML, nvidia-smi topo -m)"
        )
    counts = Counter(links.values())
    value = ", ".join(
        f"{link} ({link_meaning(link)}) x{n}"
        for link, n in sorted(counts.items(), key=lambda x: -x[1])
    )
    matrix = {f"{i}-{j}": link for (i, j), link in sorted(links.items())}
    return ok("gpu", "topology", value, pairs=matrix)


def gpu_row(gpu: GPUInfo) -> Check:
    """One visible GPU: WARN when it is busy (utilisation, memory, other processes)."""
    shown = gpu.logical_index if gpu.logical_index is not None else gpu.index
    util = "util n/a" if gpu.utilization_percent is None else f"util {gpu.utilization_percent}%"
    pids = ", ".join(map(str, gpu.processes))
    value = f"{gpu.name}, {gpu.memory_free_mib}/{gpu.memory_total_mib} MiB free, {util}, " + (
        f"processes {pids}" if pids else "no processes"
    )
    busy = busy_reason(gpu, busy_if_processes=True)
    if busy is None:
        return ok("gpu", f"gpu {shown}", value)
    return warn(
        "gpu",
        f"gpu {shown}",
        f"{value}: in use ({busy})",
        "`multigpu run` takes only idle GPUs (--gpus auto); choose others with --gpus i,j, "
        + (f"or stop pids {pids} (`nvidia-smi` names them)" if pids else "or wait for the job"),
    )


def gpu_checks(facts: GPUFacts, environ: Mapping[str, str]) -> list[Check]:
    """Rows for the GPUs this process sees and the links between them; one SKIP row without any."""
    inventory = facts.inventory
    if not inventory.gpus:
        return [skip("gpu", "gpus", "no GPU found (NVML, nvidia-smi and torch.cuda asked)")]
    visible: Sequence[GPUInfo] = visible_devices(inventory, environ)
    if not visible:
        hidden = f"CUDA_VISIBLE_DEVICES={environ.get('CUDA_VISIBLE_DEVICES', '')!r}"
        why = f"{len(inventory.gpus)} GPU(s) on the machine, hidden from this process by {hidden}"
        return [skip("gpu", "gpus", why)]
    rows = [gpu_row(gpu) for gpu in visible]
    # Links are between physical GPUs: keep the pairs of those this process sees.
    physical = {gpu.index for gpu in visible}
    links = {pair: link for pair, link in facts.links.items() if set(pair) <= physical}
    rows.append(topology_check(links, gpus=len(visible)))
    return rows

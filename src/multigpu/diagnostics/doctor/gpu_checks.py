"""GPU checks: each visible GPU's free memory, utilisation and compute processes, and how the
GPUs are linked (NVLink or the PCIe path).

The facts come from ``multigpu.gpus.read_facts`` (NVML; nvidia-smi only where NVML cannot be
loaded; torch in a child process last), so this process never creates a CUDA context.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from multigpu.diagnostics.doctor.checks import Check, ok, skip, warn
from multigpu.gpus import GPUFacts, GPUInfo, busy_reason
from multigpu.gpus.topology import link_meaning
from multigpu.gpus.visible import visible_devices


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

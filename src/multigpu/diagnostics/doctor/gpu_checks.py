"""GPU checks: each visible GPU's free memory, utilisation and compute processes, and how the
GPUs are linked (``nvidia-smi topo -m``).

GPUs come from ``multigpu.gpus`` (NVML, then ``nvidia-smi``, then torch in a child process), so
this process never creates a CUDA context.

Environment variables read: ``CUDA_VISIBLE_DEVICES`` (from the mapping given), ``PATH``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence

from multigpu.diagnostics.doctor.checks import Check, ok, skip, warn
from multigpu.gpus import GPUInfo, Inventory, busy_reason
from multigpu.gpus.smi import Runner, run_command
from multigpu.gpus.visible import visible_devices

TOPO = ["nvidia-smi", "topo", "-m"]
"""The command whose matrix says how each pair of GPUs is connected."""

LINKS = {
    "NV": "NVLink",
    "PIX": "one PCIe switch",
    "PXB": "several PCIe switches",
    "PHB": "a PCIe host bridge (the CPU)",
    "NODE": "host bridges within a NUMA node",
    "SYS": "the link between CPU sockets (QPI/UPI)",
    "SOC": "the link between CPU sockets",
}
"""What each link type of the matrix means (``NV12`` = 12 bonded NVLinks)."""

_GPU = re.compile(r"^GPU(\d+)$")


def parse_topology(text: str) -> dict[tuple[int, int], str]:
    """The link type of every pair of GPUs ``(i, j)`` with ``i < j`` in ``nvidia-smi topo -m``.

    NIC columns and rows, CPU/NUMA affinity and the legend are ignored; so are malformed rows.

    Example:
        >>> text = "\\tGPU0\\tGPU1\\tCPU Affinity\\nGPU0\\t X \\tNV12\\t0-31\\n"
        >>> parse_topology(text + "GPU1\\tNV12\\t X \\t0-31")
        {(0, 1): 'NV12'}
    """
    lines = text.splitlines()
    # The header is the first line that starts blank and names GPU0; rows start with "GPUi".
    header = next((ln for ln in lines if ln[:1].isspace() and "GPU0" in ln.split()), "")
    columns = [int(m.group(1)) for m in map(_GPU.match, header.split()) if m]
    links: dict[tuple[int, int], str] = {}
    for line in lines:
        cells = line.split()
        row = _GPU.match(cells[0]) if cells else None
        if row is None or len(cells) < len(columns) + 1:
            continue
        i = int(row.group(1))
        for j, link in zip(columns, cells[1 : len(columns) + 1], strict=True):
            if i < j and link != "X":
                links[(i, j)] = link
    return links


def topology_check(links: Mapping[tuple[int, int], str], *, gpus: int) -> Check:
    """One row: how many GPU pairs use each kind of link (the matrix goes to the JSON).

    Example:
        >>> topology_check({(0, 1): "NV12"}, gpus=2).value
        'NV12 (NVLink) x1'
    """
    if gpus < 2:
        return skip("gpu", "topology", f"{gpus} GPU visible: no GPU-to-GPU links to show")
    if not links:
        return skip("gpu", "topology", "`nvidia-smi topo -m` is not available or gave no matrix")
    counts = Counter(links.values())
    value = ", ".join(
        f"{link} ({_meaning(link)}) x{n}" for link, n in sorted(counts.items(), key=lambda x: -x[1])
    )
    matrix = {f"{i}-{j}": link for (i, j), link in sorted(links.items())}
    return ok("gpu", "topology", value, pairs=matrix)


def _meaning(link: str) -> str:
    return LINKS.get(link, LINKS["NV"] if link.startswith("NV") else "unknown link")


def gpu_row(gpu: GPUInfo) -> Check:
    """One visible GPU: WARN when it is busy (utilisation, memory, other processes).

    Example:
        >>> gpu_row(gpu).status  # doctest: +SKIP
        'OK'
    """
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


def gpu_checks(
    inventory: Inventory, environ: Mapping[str, str], runner: Runner = run_command
) -> list[Check]:
    """Rows for the GPUs this process sees and their topology; one SKIP row without any.

    Example:
        >>> [c.status for c in gpu_checks(Inventory(), {})]
        ['SKIP']
    """
    if not inventory.gpus:
        return [skip("gpu", "gpus", "no GPU found (NVML, nvidia-smi and torch.cuda asked)")]
    visible: Sequence[GPUInfo] = visible_devices(inventory, environ)
    if not visible:
        hidden = environ.get("CUDA_VISIBLE_DEVICES", "")
        return [
            skip(
                "gpu",
                "gpus",
                f"{len(inventory.gpus)} GPU(s) on the machine, hidden from this process by "
                f"CUDA_VISIBLE_DEVICES={hidden!r}",
            )
        ]
    rows = [gpu_row(gpu) for gpu in visible]
    links: dict[tuple[int, int], str] = {}
    if len(visible) > 1:
        physical = {gpu.index for gpu in visible}
        found = parse_topology(runner(TOPO) or "")
        links = {pair: link for pair, link in found.items() if set(pair) <= physical}
    rows.append(topology_check(links, gpus=len(visible)))
    return rows

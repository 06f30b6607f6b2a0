"""How each pair of GPUs is linked: NVLink (``NV12`` = 12 bonded links) or a PCIe path (``PIX``,
``PXB``, ``PHB``, ``NODE``, ``SYS``), keyed by physical-index pairs ``(i, j)`` with ``i < j``.

The names are ``nvidia-smi topo -m``'s, whichever source answers: NVML first
(``nvml_links``: the PCIe common ancestor of the two GPUs, and the NVLinks of each, counted
towards the other GPU or towards NVSwitches), else the text of ``nvidia-smi topo -m``
(``parse_topo_matrix``) — nvidia-smi has no CSV query for the topology, so that matrix is the
one place its human-readable output is read.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from multigpu.gpus.nvml import text
from multigpu.gpus.types import GPUInfo

logger = logging.getLogger(__name__)

Links = Mapping[tuple[int, int], str]
"""``{(0, 1): "NV12", (0, 2): "SYS"}``: the link of each pair of physical GPUs."""

TOPO = ["nvidia-smi", "topo", "-m"]
"""The fallback's command, run only when NVML cannot be loaded."""

LINKS = {
    "NV": "NVLink",
    "PIX": "one PCIe switch",
    "PXB": "several PCIe switches",
    "PHB": "a PCIe host bridge (the CPU)",
    "NODE": "host bridges within a NUMA node",
    "SYS": "the link between CPU sockets (QPI/UPI)",
    "SOC": "the link between CPU sockets",
}
"""What each link type means (``NV12`` = 12 bonded NVLinks)."""

# NVML's common-ancestor levels, named as `nvidia-smi topo -m` names them. INTERNAL (two GPUs
# on one board, e.g. a K80) goes through the board's own PCIe switch: PIX.
_LEVELS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
_NVLINK_SWITCH = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH
_GPU = re.compile(r"^GPU(\d+)$")


def link_meaning(link: str) -> str:
    """``"NV12"`` -> ``"NVLink"``, ``"PIX"`` -> ``"one PCIe switch"``; unknown names say so.

    Example:
        >>> link_meaning("NV4"), link_meaning("SYS")
        ('NVLink', 'the link between CPU sockets (QPI/UPI)')
    """
    return LINKS.get(link, LINKS["NV"] if link.startswith("NV") else "unknown link")


def _bus(bus_id: str) -> str:
    # NVML's busId has an 8-digit domain ("00000000:07:00.0"), busIdLegacy a 4-digit one.
    parts = bus_id.strip().lower().split(":")
    if len(parts) == 3 and all(c in "0123456789abcdef" for c in parts[0]):
        parts[0] = f"{int(parts[0] or '0', 16):x}"
    return ":".join(parts)


def _nvlinks(nvml: Any, handle: Any) -> tuple[list[str], int]:
    """The remote PCI bus ids of a GPU's active NVLinks, and how many end at an NVSwitch."""
    remotes: list[str] = []
    switches = 0
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                continue
        except nvml.NVMLError:
            # No NVLink on this GPU (NotSupported) or no link with this number: none beyond.
            break
        try:
            kind = nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
        except (nvml.NVMLError, AttributeError):
            kind = None  # not answered (older drivers): a GPU peer still matches by bus id below
        if kind == _NVLINK_SWITCH:
            switches += 1
            continue
        try:
            remotes.append(_bus(text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)))
        except nvml.NVMLError as e:
            logger.debug("NVLink %s remote not answered: %s", link, e)
    return remotes, switches


def nvml_links(nvml: Any, gpus: Sequence[GPUInfo]) -> dict[tuple[int, int], str]:
    """Every pair of ``gpus`` (physical ones, from ``nvml_inventory``) through an open NVML.

    A pair joined by NVLinks is ``NV<n>``: n links between the two, or, on an NVSwitch machine
    (DGX/HGX), the fewer of the two GPUs' links to switches. Otherwise the PCIe level of their
    common ancestor. A pair NVML does not answer for is left out.
    """
    if len(gpus) < 2:
        return {}
    try:
        handles = {g.index: nvml.nvmlDeviceGetHandleByIndex(g.index) for g in gpus}
    except nvml.NVMLError as e:
        logger.debug("NVML handles for the topology not answered: %s", e)
        return {}
    by_bus = {_bus(g.pci_bus_id): g.index for g in gpus if g.pci_bus_id}
    direct: Counter[tuple[int, int]] = Counter()
    switched: dict[int, int] = {}
    for index, handle in handles.items():
        remotes, switched[index] = _nvlinks(nvml, handle)
        for bus in remotes:
            peer = by_bus.get(bus)
            # Each link is seen from both ends: count it from the lower index only.
            if peer is not None and index < peer:
                direct[(index, peer)] += 1
    links: dict[tuple[int, int], str] = {}
    for i, j in itertools.combinations(sorted(handles), 2):
        count = direct.get((i, j)) or min(switched[i], switched[j])
        if count:
            links[(i, j)] = f"NV{count}"
            continue
        try:
            level = nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
        except nvml.NVMLError as e:
            logger.debug("NVML topology of GPUs %s, %s not answered: %s", i, j, e)
            continue
        links[(i, j)] = _LEVELS.get(int(level), "SYS" if int(level) > 50 else "PIX")
    return links


def parse_topo_matrix(text: str) -> dict[tuple[int, int], str]:
    """The link of every pair of GPUs ``(i, j)``, ``i < j``, in ``nvidia-smi topo -m``'s text.

    NIC columns and rows, CPU/NUMA affinity and the legend are ignored; so are malformed rows.

    Example:
        >>> text = "\\tGPU0\\tGPU1\\tCPU Affinity\\nGPU0\\t X \\tNV12\\t0-31\\n"
        >>> parse_topo_matrix(text + "GPU1\\tNV12\\t X \\t0-31")
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

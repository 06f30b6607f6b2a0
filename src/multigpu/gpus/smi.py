"""Read GPUs and the driver from ``nvidia-smi`` (the fallback when NVML cannot be loaded).

Its machine-readable modes only: ``--query-gpu`` / ``--query-compute-apps`` with
``--format=csv,noheader,nounits``, and ``-q -x`` (XML) for the one fact the CSV query lacks,
the newest CUDA the driver supports. Two exceptions, for want of any CSV form: ``-L`` for MIG
instances (here) and ``topo -m`` for the links (``multigpu.gpus.topology``).

The parsers take the command's text, and ``read_smi`` takes a ``runner`` callable, so tests feed
recorded outputs instead of running the command. A missing command returns at once (no wait);
a hung driver is cut off after ``SMI_TIMEOUT_S``.

Environment variables read: ``PATH`` (to find ``nvidia-smi``).
"""

from __future__ import annotations

import csv
import logging
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import replace

from multigpu.gpus.types import DriverFacts, GPUInfo, Inventory

logger = logging.getLogger(__name__)

Runner = Callable[[Sequence[str]], "str | None"]
"""Runs an argv and returns its stdout, or None when the command is missing or failed."""

SMI_TIMEOUT_S = 10.0
QUERY_GPU = [
    "nvidia-smi",
    "--query-gpu=index,uuid,name,pci.bus_id,memory.total,memory.used,memory.free,utilization.gpu",
    "--format=csv,noheader,nounits",
]
QUERY_APPS = [
    "nvidia-smi",
    "--query-compute-apps=gpu_uuid,pid,used_memory",
    "--format=csv,noheader,nounits",
]
LIST = ["nvidia-smi", "-L"]
"""No CSV query lists MIG instances; ``-L``'s lines are the documented way to get their UUIDs."""
QUERY_DRIVER = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
QUERY_XML = ["nvidia-smi", "-q", "-x"]

# "  MIG 1g.10gb     Device  0: (UUID: MIG-c6d4f1ef-...)" under "GPU 0: NAME (UUID: GPU-...)";
# drivers before R470 print "MIG-GPU-<uuid>/<gi>/<ci>" instead — both are CUDA tokens.
_GPU_LINE = re.compile(r"^GPU\s+(\d+):.*\(UUID:\s*(GPU-[^)\s]+)\)")
_MIG_LINE = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+\d+:\s*\(UUID:\s*(MIG-[^)\s]+)\)")
_GB = re.compile(r"(\d+)gb$", re.IGNORECASE)


def run_smi(argv: Sequence[str]) -> str | None:
    """The default runner: stdout of ``argv``, or None if missing, failing or slower than 10 s."""
    exe = shutil.which(argv[0])
    if exe is None:
        return None  # looked up first so a machine without the driver answers instantly
    try:
        done = subprocess.run(
            [exe, *argv[1:]],
            capture_output=True,
            text=True,
            timeout=SMI_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        logger.debug("%s failed: %s", argv[0], e)
        return None
    if done.returncode != 0:
        # e.g. "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"
        logger.debug("%s exited %s: %s", argv[0], done.returncode, done.stderr.strip()[:300])
        return None
    return done.stdout


def _number(text: str) -> int | None:
    """An integer field, or None for ``[N/A]``, ``[Not Supported]``, ``N/A`` and the like."""
    try:
        return int(float(text))
    except (ValueError, OverflowError):  # "[N/A]" and the like; "inf"
        return None


def _rows(text: str) -> list[list[str]]:
    reader = csv.reader(text.splitlines(), skipinitialspace=True)
    return [[cell.strip() for cell in row] for row in reader if row and any(row)]


def parse_query_gpu(text: str) -> list[GPUInfo]:
    """Parse ``nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,memory.total,memory.used,
    memory.free,utilization.gpu --format=csv,noheader,nounits``; malformed rows are skipped.

    Example:
        >>> row = "0, GPU-1a, NVIDIA A100-SXM4-80GB, 00000000:07:00.0, 81920, 3, 81036, 0"
        >>> parse_query_gpu(row)[0].memory_free_mib
        81036
    """
    gpus = []
    for row in _rows(text):
        index = _number(row[0]) if len(row) >= 8 else None
        if index is None:
            logger.debug("nvidia-smi row skipped (fewer than 8 fields or no index): %s", row)
            continue
        # Memory "[N/A]" (some vGPU and old boards): 0 means unknown, never "busy by memory".
        total, used, free = _number(row[4]) or 0, _number(row[5]), _number(row[6])
        if free is None:
            free = max(total - used, 0) if used is not None else total
        gpus.append(
            GPUInfo(
                index=index,
                uuid=row[1],
                name=row[2],
                pci_bus_id="" if row[3].startswith("[") else row[3],
                memory_total_mib=total,
                memory_free_mib=free,
                memory_used_mib=used,
                utilization_percent=_number(row[7]),
                visible_id=row[1] if row[1].startswith("GPU-") else str(index),
            )
        )
    return sorted(gpus, key=lambda g: g.index)


def parse_compute_apps(text: str) -> dict[str, tuple[int, ...]]:
    """Parse ``--query-compute-apps=gpu_uuid,pid,used_memory``: GPU UUID → pids on it.

    Example:
        >>> parse_compute_apps("GPU-1a, 4242, 1024\\nGPU-1a, 4243, [N/A]")
        {'GPU-1a': (4242, 4243)}
    """
    pids: dict[str, list[int]] = {}
    for row in _rows(text):
        pid = _number(row[1]) if len(row) >= 2 else None
        if pid is not None:
            pids.setdefault(row[0], []).append(pid)
    return {uuid: tuple(sorted(set(p))) for uuid, p in pids.items()}


def parse_mig_list(text: str, gpus: Sequence[GPUInfo]) -> list[GPUInfo]:
    """The MIG instances of ``gpus`` in ``nvidia-smi -L`` (the CSV query has no per-instance rows).

    Memory comes from the profile name (``3g.20gb`` → 20480 MiB); the free memory of an instance
    is not reported there, so it is given as the total.
    """
    by_index = {g.index: g for g in gpus}
    migs: list[GPUInfo] = []
    parent: GPUInfo | None = None
    for line in text.splitlines():
        gpu = _GPU_LINE.match(line)
        if gpu:
            parent = by_index.get(int(gpu.group(1)))
            continue
        mig = _MIG_LINE.match(line)
        if mig and parent is not None:
            size = _GB.search(mig.group(1))
            total = (int(size.group(1)) * 1024 if size else 0) or parent.memory_total_mib
            migs.append(
                parent.mig_instance(
                    uuid=mig.group(2), profile=mig.group(1), total_mib=total, free_mib=total
                )
            )
    return migs


def read_smi(runner: Runner = run_smi) -> Inventory | None:
    """Every GPU nvidia-smi reports, with its compute processes and MIG instances; None when
    nvidia-smi is missing or fails (the next probe is tried).

    Example:
        >>> read_smi(lambda argv: None) is None
        True
    """
    text = runner(QUERY_GPU)
    if text is None:
        return None
    gpus = parse_query_gpu(text)
    apps = parse_compute_apps(runner(QUERY_APPS) or "") if gpus else {}
    gpus = [replace(g, processes=apps[g.uuid]) if g.uuid in apps else g for g in gpus]
    migs = parse_mig_list(runner(LIST) or "", gpus) if gpus else []
    return Inventory(gpus=tuple(gpus), migs=tuple(migs), source="nvidia-smi")


def parse_driver_csv(text: str) -> str | None:
    """The driver version from ``--query-gpu=driver_version --format=csv,noheader`` (one row
    per GPU, all the same); None when absent.

    Example:
        >>> parse_driver_csv("570.86.15\\n570.86.15\\n")
        '570.86.15'
    """
    return next((row[0] for row in _rows(text) if row[0] and not row[0].startswith("[")), None)


def parse_cuda_xml(text: str) -> str | None:
    """``<cuda_version>`` of ``nvidia-smi -q -x`` (the CSV query has no such field); None when
    the XML is absent, malformed or lacks it.

    Example:
        >>> parse_cuda_xml("<nvidia_smi_log><cuda_version>12.8</cuda_version></nvidia_smi_log>")
        '12.8'
    """
    try:
        # nvidia-smi's own output: a local, trusted document (its DOCTYPE names a DTD file that
        # the parser does not fetch).
        root = ET.fromstring(text.strip())
    except ET.ParseError as e:
        logger.debug("nvidia-smi -q -x is not XML: %s", e)
        return None
    cuda = (root.findtext("cuda_version") or "").strip()
    return cuda if cuda and not cuda.startswith("N/A") else None


def read_smi_driver(runner: Runner = run_smi) -> DriverFacts | None:
    """The driver's version (CSV query) and its newest CUDA (XML); None without a driver.

    Example:
        >>> read_smi_driver(lambda argv: None) is None
        True
    """
    version = parse_driver_csv(runner(QUERY_DRIVER) or "")
    if version is None:
        return None
    return DriverFacts(
        version=version, cuda=parse_cuda_xml(runner(QUERY_XML) or ""), source="nvidia-smi"
    )

"""Apply ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER`` to an inventory, as CUDA does.

The rules (CUDA's): unset → every device; ``""`` or ``-1`` → none; entries are indices, ``GPU-``
UUIDs or unique UUID prefixes, or MIG tokens (``MIG-...``, matched whole or as a unique prefix,
never interpreted); the list stops at the first entry that is invalid, ambiguous or repeated.
A MIG-enabled GPU stands for its MIG instances (CUDA runs one process per instance).

Device order: nvidia-smi and NVML number GPUs in PCI bus order, CUDA by default FASTEST_FIRST.
The launcher sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` for the workers so that both agree. Here
indices are always read in PCI order: FASTEST_FIRST depends on CUDA's private speed ranking,
which cannot be reproduced without creating a context, and on machines of identical GPUs it is
PCI order anyway. A warning says so when a user's index may mean another GPU.

Environment variables read (from the mapping passed in): ``CUDA_VISIBLE_DEVICES``,
``CUDA_DEVICE_ORDER``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping

from multigpu.common.log import warn_once
from multigpu.gpus.types import GPUInfo, Inventory

logger = logging.getLogger(__name__)


def expand(inventory: Inventory) -> list[GPUInfo]:
    """Every CUDA device of the inventory in PCI order: each GPU, or its MIG instances."""
    devices: list[GPUInfo] = []
    for gpu in inventory.gpus:
        devices.extend([m for m in inventory.migs if m.index == gpu.index] or [gpu])
    return devices


def _by_prefix(token: str, devices: list[GPUInfo], uuids: list[str]) -> list[GPUInfo] | None:
    hits = [token] if token in uuids else [u for u in dict.fromkeys(uuids) if u.startswith(token)]
    if len(hits) != 1:
        return None  # unknown or ambiguous prefix: CUDA treats it as invalid
    return [d for d, u in zip(devices, uuids, strict=True) if u == hits[0]]


def _resolve(token: str, inventory: Inventory, devices: list[GPUInfo]) -> list[GPUInfo] | None:
    """The device(s) one entry names, or None when it is invalid."""
    if token.startswith("MIG-"):
        return _by_prefix(token, devices, [d.uuid for d in devices])
    # GPU indices and UUIDs name physical GPUs; a MIG-enabled one expands to its instances.
    parents = {g.index: g.uuid for g in inventory.gpus}
    parent_uuids = [parents.get(d.index, "") for d in devices]
    if token.startswith("GPU-"):
        return _by_prefix(token, devices, parent_uuids)
    if token.isdigit():
        position = int(token)
        if position >= len(inventory.gpus):
            return None
        uuid = inventory.gpus[position].uuid
        return [d for d, u in zip(devices, parent_uuids, strict=True) if u == uuid]
    return None


def visible_devices(inventory: Inventory, environ: Mapping[str, str]) -> list[GPUInfo]:
    """The devices a process with ``environ`` sees, with ``logical_index`` set, in that order."""
    devices = expand(inventory)
    spec = environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        chosen = devices
    else:
        chosen = []
        for token in map(str.strip, spec.split(",")):
            found = _resolve(token, inventory, devices)
            if not found or any(f in chosen for f in found):
                if spec.strip() not in ("", "-1"):
                    logger.debug("CUDA_VISIBLE_DEVICES=%s: stops at %r", spec, token)
                break
            chosen.extend(found)
    order = environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST").strip().upper()
    names = {g.name for g in inventory.gpus}
    if order != "PCI_BUS_ID" and len(names) > 1 and spec is not None:
        warn_once(
            logger,
            "CUDA_DEVICE_ORDER=%s with different GPU models: CUDA may number them differently "
            "from nvidia-smi; indices are read in PCI bus order (set CUDA_DEVICE_ORDER=PCI_BUS_ID)",
            order,
        )
    return [dataclasses.replace(d, logical_index=i) for i, d in enumerate(chosen)]

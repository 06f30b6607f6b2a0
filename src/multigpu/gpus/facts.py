"""Every GPU fact of this machine from one source, NVML first (``read_facts``), and the GPUs a
process sees (``list_gpus``).

The facts: each GPU (index, UUID, name, memory total/free/used, utilisation, compute processes,
MIG instances), the driver (its version and the newest CUDA it supports) and the links between
GPUs (NVLink or the PCIe path). The sources, in order:

1. NVML (nvidia-ml-py), in one ``nvmlInit`` session;
2. ``nvidia-smi``'s machine-readable modes, only when NVML cannot be loaded or its inventory
   query fails (``multigpu.gpus.smi``; ``topo -m`` for the links, which have no CSV form);
3. ``torch.cuda`` in a child process, for the GPUs only (ROCm; no driver, no links).

None of them creates a CUDA context in this process (see ``torch_probe`` for why that matters to
a launcher that forks workers). On a machine without a GPU the whole chain answers in well under
a second: NVML fails to load its library, a missing ``nvidia-smi`` is not waited for, and the
torch probe is skipped without a device node. Tests hand in a stand-in NVML module (``nvml=``)
and recorded nvidia-smi outputs (``runner=``).

Environment variables read: ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER`` (from the mapping
given, default ``os.environ``, which also goes to the torch probe's child); ``PATH`` (for
``nvidia-smi``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from multigpu.gpus.nvml import close_nvml, nvml_driver, nvml_inventory, open_nvml
from multigpu.gpus.smi import Runner, read_smi, read_smi_driver, run_smi
from multigpu.gpus.topology import TOPO, Links, nvml_links, parse_topo_matrix
from multigpu.gpus.torch_probe import read_torch
from multigpu.gpus.types import DriverFacts, GPUInfo, Inventory
from multigpu.gpus.visible import visible_devices

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class GPUFacts:
    """What ``read_facts`` found. ``inventory.source`` says which source answered."""

    inventory: Inventory = field(default_factory=Inventory)
    """Every physical GPU and MIG instance (before ``CUDA_VISIBLE_DEVICES`` is applied)."""
    driver: DriverFacts | None = None
    """The NVIDIA driver; None when none answers (or not asked for)."""
    links: Links = field(default_factory=dict)
    """``(i, j)`` physical-index pairs, ``i < j`` -> ``"NV12"``, ``"PIX"``...; empty when
    unknown, not asked for, or fewer than 2 GPUs."""


def read_facts(
    environ: Mapping[str, str] | None = None,
    *,
    nvml: Any | None = None,
    runner: Runner = run_smi,
    driver: bool = True,
    links: bool = True,
) -> GPUFacts:
    """The machine's GPU facts from the first source that answers (see the module docstring).

    ``driver`` and ``links`` ask for those facts too (the doctor does; the launcher does not).
    """
    session = open_nvml(nvml)
    if session is not None:
        try:
            found = nvml_inventory(session)
            if found is not None:
                return GPUFacts(
                    inventory=found,
                    driver=nvml_driver(session) if driver else None,
                    links=nvml_links(session, found.gpus) if links else {},
                )
        finally:
            close_nvml(session)
    smi = read_smi(runner)
    if smi is not None:
        return GPUFacts(
            inventory=smi,
            driver=read_smi_driver(runner) if driver else None,
            links=parse_topo_matrix(runner(TOPO) or "") if links and len(smi.gpus) > 1 else {},
        )
    return GPUFacts(inventory=read_torch(environ) or Inventory())


def discover_gpus(environ: Mapping[str, str] | None = None) -> Inventory:
    """Every GPU of the machine, from the first probe that answers (``source`` says which)."""
    found = read_facts(environ, driver=False, links=False).inventory
    logger.debug("GPUs from %s: %s", found.source, len(found.gpus))
    return found


def list_gpus(environ: Mapping[str, str] | None = None) -> list[GPUInfo]:
    """The GPUs a process with ``environ`` (default ``os.environ``) sees, by logical index.

    ``CUDA_VISIBLE_DEVICES`` is applied as CUDA applies it (``multigpu.gpus.visible``); a
    MIG-enabled GPU appears as its MIG instances; ``[]`` without any GPU.

    Example:
        >>> list_gpus({"CUDA_VISIBLE_DEVICES": ""})
        []
    """
    env = os.environ if environ is None else environ
    return visible_devices(discover_gpus(env), env)

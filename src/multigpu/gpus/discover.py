"""``list_gpus`` / ``all_gpus``: find the machine's GPUs, cheapest and safest probe first.

Order (``multigpu.gpus.facts``): NVML (nvidia-ml-py) → ``nvidia-smi`` (only when NVML cannot be
loaded) → ``torch.cuda`` in a child process. Each failing probe falls through to the next; none
of them creates a CUDA context in this process (see ``torch_probe`` for why that matters to a
launcher that forks workers). On a machine without a GPU the whole chain answers ``[]`` in well
under a second: NVML fails to load its library, a missing ``nvidia-smi`` is not waited for, and
the torch probe is skipped without a device node.

Environment variables read: ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER`` (from the mapping
given, default ``os.environ``), ``PATH`` (for ``nvidia-smi``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from multigpu.gpus.facts import read_facts
from multigpu.gpus.types import GPUInfo, Inventory
from multigpu.gpus.visible import physical_devices, visible_devices

logger = logging.getLogger(__name__)


def discover_gpus(environ: Mapping[str, str] | None = None) -> Inventory:
    """Every GPU of the machine, from the first probe that answers (``source`` says which).

    Example:
        >>> discover_gpus().source  # on a machine without GPUs  # doctest: +SKIP
        'none'
    """
    found = read_facts(environ, driver=False, links=False).inventory
    logger.debug("GPUs from %s: %s", found.source, len(found.gpus))
    return found


def list_gpus(environ: Mapping[str, str] | None = None) -> list[GPUInfo]:
    """The GPUs a process with ``environ`` sees, ordered by logical index; ``[]`` without any.

    ``CUDA_VISIBLE_DEVICES`` is applied as CUDA applies it: unset = all; ``""`` or ``-1`` =
    none; indices, ``GPU-`` UUIDs or unique prefixes, ``MIG-`` tokens; the list stops at the
    first invalid entry. A MIG-enabled GPU appears as its MIG instances. Indices are read in
    PCI bus order (the launcher sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` for its workers so CUDA
    agrees; FASTEST_FIRST cannot be reproduced and is treated as PCI order).

    Args:
        environ: the environment to apply (default ``os.environ``); read only.

    Example:
        >>> list_gpus({"CUDA_VISIBLE_DEVICES": ""})
        []
    """
    env = os.environ if environ is None else environ
    return visible_devices(discover_gpus(env), env)


def all_gpus() -> list[GPUInfo]:
    """Every physical GPU, ignoring ``CUDA_VISIBLE_DEVICES``, in physical-index order.

    ``logical_index`` is the index this process sees under its ``CUDA_VISIBLE_DEVICES``, or
    None for a GPU it hides; MIG instances are not listed separately.

    Example:
        >>> all_gpus()  # on a machine without GPUs  # doctest: +SKIP
        []
    """
    return physical_devices(discover_gpus(os.environ), os.environ)

"""GPU discovery, selection and locking for the launcher (never creates a CUDA context).

- ``list_gpus(environ)``: NVML, then ``nvidia-smi`` (only when NVML cannot be loaded), then
  ``torch.cuda`` in a child process; ``CUDA_VISIBLE_DEVICES`` applied as CUDA does.
- ``read_facts(environ)``: the same GPUs plus the driver and the links between GPUs, from one
  source (what ``multigpu doctor`` reports).
- ``parse_gpu_request(text)`` / ``select_gpus(gpus, request)``: what ``--gpus`` means.
- ``claim_gpus(request)``: select under per-GPU ``flock`` locks, so concurrent jobs never share.
- ``format_gpu_table(gpus)``: the listing printed by ``multigpu gpus`` and ``--dry-run``.

Device order: see ``multigpu.gpus.visible``; workers get UUIDs (``GPUInfo.visible_id``), which
mean the same GPU in any order.

Environment variables read: ``CUDA_VISIBLE_DEVICES``, ``CUDA_DEVICE_ORDER``,
``MULTIGPU_LOCK_DIR``, ``PATH`` (see the submodules).
"""

from __future__ import annotations

from multigpu.gpus.facts import GPUFacts, list_gpus, read_facts
from multigpu.gpus.lock import claim_gpus
from multigpu.gpus.select import busy_reason, parse_gpu_request, select_gpus
from multigpu.gpus.table import format_gpu_table
from multigpu.gpus.types import DriverFacts, GPUInfo

__all__ = [
    "DriverFacts",
    "GPUFacts",
    "GPUInfo",
    "busy_reason",
    "claim_gpus",
    "format_gpu_table",
    "list_gpus",
    "parse_gpu_request",
    "read_facts",
    "select_gpus",
]

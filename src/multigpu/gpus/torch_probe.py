"""Read GPUs through ``torch.cuda`` — the last resort, when NVML and nvidia-smi both failed
(e.g. ROCm builds, whose devices NVML cannot see).

Why in a child process: ``torch.cuda.device_count()`` initialises the driver and
``torch.cuda.mem_get_info`` creates a CUDA context. A process that did either and then forks
(torchrun's workers, DataLoader workers) gets "Cannot re-initialize CUDA in forked subprocess",
and the context holds ~300-500 MiB on a GPU the job may not even use. So the launcher's process
never does it: a short-lived ``python -c`` child does, with ``CUDA_VISIBLE_DEVICES`` removed and
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so its indices are physical ones.

The probe is skipped (instantly) when no GPU device node exists (``/dev/nvidiactl``,
``/dev/nvidia0``, ``/dev/kfd``, ``/dev/dxg``) or torch has neither CUDA nor ROCm built in.

Environment variables read: the whole environment is passed on to the child, minus
``CUDA_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES`` / ``ROCR_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from multigpu.gpus.types import GPUInfo, Inventory

logger = logging.getLogger(__name__)

TORCH_TIMEOUT_S = 60.0
DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")
_HIDING = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")

_CHILD = """
import json, torch
out = []
if torch.cuda.is_available():
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        free, total = torch.cuda.mem_get_info(i)
        uuid = str(getattr(p, "uuid", "") or "")
        bus = getattr(p, "pci_bus_id", None)
        out.append({"index": i, "name": p.name, "uuid": uuid, "free": free, "total": total,
                    "pci": "%08x:%02x:%02x.0" % (getattr(p, "pci_domain_id", 0), bus,
                    getattr(p, "pci_device_id", 0)) if bus is not None else ""})
print(json.dumps(out))
"""


def has_gpu_device_node(nodes: Sequence[str] = DEVICE_NODES) -> bool:
    """True when a GPU driver's device node exists (without one, no probe can find a GPU)."""
    return any(os.path.exists(n) for n in nodes)


def parse_torch_probe(rows: Sequence[Mapping[str, Any]]) -> list[GPUInfo]:
    """The child's answer as GPUs (no utilisation or processes: torch does not say)."""
    gpus = []
    for d in rows:
        uuid = d["uuid"]
        if uuid and not uuid.startswith("GPU-"):
            uuid = f"GPU-{uuid}"
        gpus.append(
            GPUInfo(
                index=int(d["index"]),
                uuid=uuid or f"index-{d['index']}",
                name=str(d["name"]),
                pci_bus_id=str(d["pci"]),
                memory_total_mib=int(d["total"]) // (1024 * 1024),
                memory_free_mib=int(d["free"]) // (1024 * 1024),
                memory_used_mib=(int(d["total"]) - int(d["free"])) // (1024 * 1024),
                # The launcher sets CUDA_DEVICE_ORDER=PCI_BUS_ID, so the physical index is
                # understood by the workers; HIP accepts indices, not NVIDIA UUIDs.
                visible_id=str(d["index"]),
            )
        )
    return gpus


def read_torch(environ: Mapping[str, str] | None = None) -> Inventory | None:
    """GPUs as torch.cuda sees them, probed in a child process; None when there are none."""
    if not has_gpu_device_node():
        return None
    import torch  # here, not at the top: the launcher's own imports stay light

    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        logger.debug("torch %s has no CUDA/ROCm support; torch probe skipped", torch.__version__)
        return None
    given = os.environ if environ is None else environ
    env = {k: v for k, v in given.items() if k not in _HIDING} | {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    answer = json_from_child(_CHILD, env, TORCH_TIMEOUT_S, "torch probe")
    try:
        gpus = parse_torch_probe(answer) if answer is not None else []
    except (ValueError, KeyError, TypeError) as e:
        logger.debug("torch probe failed: %s", e)
        return None
    return Inventory(gpus=tuple(gpus), source="torch") if gpus else None


def json_from_child(code: str, env: Mapping[str, str], timeout: float, what: str) -> Any:
    """The last line of ``python -c code``'s output as JSON; None (logged) when it failed.

    Children, not this process, initialise CUDA: see the module's docstring.

    Example:
        >>> json_from_child("print(1 + 1)", os.environ, 60, "sum")
        2
    """
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env=dict(env),
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            logger.debug("%s failed: %s", what, done.stderr.strip()[-500:])
            return None
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
        logger.debug("%s failed: %s", what, e)
        return None

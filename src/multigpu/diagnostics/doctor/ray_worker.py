"""The doctor's rows for a Ray Train worker (``multigpu doctor`` run from a ``TorchTrainer``'s
training function, in a subprocess or in the worker itself).

Ray Train, not a launcher of multigpu's, started the process: the rows say so and check what a
multigpu loop there relies on — that this Python imports the ``ray`` the worker runs, that the
process group's store Ray's rank 0 hosts answers (``MASTER_ADDR:MASTER_PORT``, with
``TorchConfig(init_method="env")``, Ray's default), which device the loop gets (Ray's, from the
GPUs Ray gave the worker: ``CUDA_VISIBLE_DEVICES``, not ``cuda:LOCAL_RANK``) and the timeout its
process group will have (multigpu's, not Ray's 1800 s).

Environment variables read: ``MASTER_ADDR``, ``MASTER_PORT``, ``CUDA_VISIBLE_DEVICES``,
``MULTIGPU_TIMEOUT``.
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Mapping

from multigpu.common.store_reach import StoreUnreachable, wait_until_listening
from multigpu.common.variables import DEFAULT_TIMEOUT_S
from multigpu.diagnostics.doctor.checks import Check, fail, ok, skip
from multigpu.env.types import ClusterEnv

REACH_S = 3.0
"""How long Ray's store has to accept a connection."""


def ray_rows(environ: Mapping[str, str], env: ClusterEnv | None) -> list[Check]:
    """The Ray Train rows: none outside a Ray Train worker (``env.source != "ray"``).

    Example:
        >>> ray_rows({}, None)
        []
    """
    if env is None or env.source != "ray":
        return []
    try:
        version = importlib.metadata.version("ray")
    except importlib.metadata.PackageNotFoundError:
        return [
            fail(
                "launch",
                "Ray Train",
                f"a Ray Train worker (rank {env.rank} of {env.world_size}), but {sys.executable} "
                "has no ray package",
                "run the doctor with the workers' Python, or pip install 'multigpu[ray]' in it",
            )
        ]
    timeout = environ.get("MULTIGPU_TIMEOUT", "").strip() or f"{DEFAULT_TIMEOUT_S:g}"
    rows = [
        ok(
            "launch",
            "Ray Train",
            f"a TorchTrainer worker (ray {version}): rank {env.rank} of {env.world_size} on node "
            f"{env.node_rank}; Ray made the process group, multigpu.init adopts it and gives it "
            f"multigpu's timeout ({timeout} s, MULTIGPU_TIMEOUT or init(timeout=)), not Ray's "
            "TorchConfig(timeout_s=1800)",
        ),
        _store_row(environ),
    ]
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        said = "no GPU given to this worker (ScalingConfig(use_gpu=False)): CPU, gloo"
    else:
        said = (
            f"Ray gave this worker GPU(s) {visible} (CUDA_VISIBLE_DEVICES): multigpu.init uses "
            "ray.train.torch.get_device(), not cuda:LOCAL_RANK"
        )
    rows.append(ok("launch", "Ray device", said))
    return rows


def _store_row(environ: Mapping[str, str]) -> Check:
    """Whether the store of Ray's process group (hosted by rank 0's worker) answers."""
    host, port = environ.get("MASTER_ADDR", "").strip(), environ.get("MASTER_PORT", "").strip()
    if not host or not port.isdigit():
        return skip(
            "launch",
            "Ray's store",
            "MASTER_ADDR/MASTER_PORT not set (TorchConfig(init_method='tcp')): not checked",
        )
    try:
        wait_until_listening(host, int(port), REACH_S)
    except StoreUnreachable as e:
        return fail(
            "launch",
            "Ray's store",
            f"nothing answers at {host}:{port} within {REACH_S:g} s ({e.last_error})",
            "rank 0's worker hosts it while the training function runs: run the doctor from the "
            "training function, and check that the nodes reach each other on that address",
        )
    return ok("launch", "Ray's store", f"the process group's store at {host}:{port} answers")

"""The launcher's check of the ``MULTIGPU_*`` variables its workers will read, before any starts.

The workers inherit the launcher's environment, and each would refuse a bad value on its own
(``multigpu.init``: one line, exit code 2) — after torch and the job's data were loaded on every
rank. Checking here says it once, before anything starts.

Environment variables read: those of ``multigpu.common.variables.check_environment``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from multigpu.common import variables
from multigpu.common.mesh_spec import resolve_sizes
from multigpu.errors import UsageError
from multigpu.launch.options import parse_nnodes
from multigpu.launch.plan import LaunchPlan


def check_worker_environment(plan: LaunchPlan, environ: Mapping[str, str] | None = None) -> None:
    """Refuse a ``MULTIGPU_*`` value the workers of ``plan`` would refuse.

    The user's own values are checked even where the plan sets the variable itself
    (``--cpu`` sets ``MULTIGPU_DEVICE=cpu``): a bad value in the environment is a mistake
    wherever it lands. Then what the workers will see (the plan's variables over the user's).

    Raises:
        UsageError: a value that is not valid (``MULTIGPU_STRATEGY=bogus``),
            ``MULTIGPU_BACKEND=nccl`` for CPU processes, or a ``MULTIGPU_MESH`` whose sizes do
            not multiply to the planned world size (when the number of nodes is fixed).
    """
    env = os.environ if environ is None else environ
    variables.check_environment(env)
    workers = {**env, **plan.env}
    variables.check_environment(workers)
    if plan.device == "cpu" and variables.backend(workers) == "nccl":
        raise UsageError(
            "MULTIGPU_BACKEND=nccl (from the environment) needs GPUs, but this run's workers are "
            "CPU processes; unset MULTIGPU_BACKEND (gloo is chosen on CPU) or run on GPUs"
        )
    check_mesh(plan, workers)


def check_mesh(plan: LaunchPlan, environ: Mapping[str, str]) -> None:
    """Refuse a ``MULTIGPU_MESH`` that cannot cover the planned world (nodes x processes).

    An elastic node range (``--nnodes 1:4``) is left to the workers: the world size is known
    only once the nodes have joined.
    """
    shape = variables.mesh(environ)
    if shape is None:
        return
    nnodes = "1"
    for arg in plan.torchrun_args:
        if arg.startswith("--nnodes="):
            nnodes = arg.partition("=")[2]
    low, high = parse_nnodes(nnodes)
    if low != high:
        return
    world = high * plan.nproc_per_node
    try:
        resolve_sizes(shape, world)
    except UsageError as e:
        raise UsageError(
            f"MULTIGPU_MESH={environ['MULTIGPU_MESH'].strip()} (from the environment): {e}"
        ) from e

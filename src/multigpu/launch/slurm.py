"""SLURM for the launcher: ``srun multigpu run`` on every node, and ``multigpu slurm`` (sbatch).

``srun --ntasks-per-node=1 multigpu run script.py`` starts one launcher per node. Each one is a
task of the srun step, so the step's variables say how many nodes there are (tasks), which one
this is (task id), and where node 0 is (the first host of the step's node list, expanded for
forms like ``node[01-04,07]``); the port comes from the job and step ids, so every node computes
the same one without talking (``multigpu.env.slurm``). The launcher turns that into torchrun's
static rendezvous: ``--nnodes N --node-rank R --master-addr HOST --master-port PORT``.

``multigpu slurm --nodes N --gpus-per-node G script.py`` writes the sbatch script that does this.

Environment variables read: SLURM's (through ``multigpu.env.slurm``), ``MASTER_ADDR``,
``MASTER_PORT``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from multigpu.env import slurm as slurm_env
from multigpu.errors import EnvError, UsageError
from multigpu.launch.options import RDZV_DESTS, LaunchOptions

TOPOLOGY_DESTS = ("nnodes", "node_rank", "master_addr", "master_port")


def with_slurm_topology(options: LaunchOptions, environ: Mapping[str, str]) -> LaunchOptions:
    """``options`` with the node topology of the srun step added, unless the user gave any."""
    if any(options.given(d) for d in (*TOPOLOGY_DESTS, *RDZV_DESTS)):
        return options  # the user's own rendezvous wins
    topology = slurm_topology(environ)
    if topology is None:
        return options
    return dataclasses.replace(options, torchrun=MappingProxyType({**options.torchrun, **topology}))


def slurm_topology(environ: Mapping[str, str]) -> dict[str, Any] | None:
    """torchrun options for this node when ``multigpu run`` is a task of a multi-node srun step.

    Returns None outside an srun step, or on one node (one launcher does everything there).

    Raises:
        UsageError: the step has several tasks per node (each launcher starts all of its
            node's workers: use ``srun --ntasks-per-node=1``).

    Example:
        >>> slurm_topology({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1",
        ...     "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_STEP_NUM_TASKS": "2",
        ...     "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        ...     "SLURM_STEP_NODELIST": "gpu[07-08]"})
        {'nnodes': '2', 'node_rank': 1, 'master_addr': 'gpu07', 'master_port': 15070}
    """
    try:
        step = slurm_env.from_environ(environ)
    except EnvError as e:
        raise UsageError(f"the SLURM variables of this srun step do not add up: {e}") from e
    if step is None or step.num_nodes < 2:
        return None
    if step.local_world_size != 1:
        raise UsageError(
            f"srun started {step.local_world_size} tasks on this node; expected one "
            "`multigpu run` per node, which starts the node's workers itself: use "
            "`srun --ntasks-per-node=1 multigpu run ...`"
        )
    return {
        "nnodes": str(step.world_size),
        "node_rank": step.rank,
        "master_addr": step.master_addr,
        "master_port": step.master_port,
    }

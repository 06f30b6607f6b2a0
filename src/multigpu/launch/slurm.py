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

import argparse
import dataclasses
import os
import shlex
import stat
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, NoReturn

from multigpu.env import slurm as slurm_env
from multigpu.errors import EnvError, UsageError
from multigpu.launch.options import RDZV_DESTS, LaunchOptions

TOPOLOGY_DESTS = ("nnodes", "node_rank", "master_addr", "master_port")


def with_slurm_topology(options: LaunchOptions, environ: Mapping[str, str]) -> LaunchOptions:
    """``options`` with the node topology of the srun step added, unless the user gave any.

    Example:
        >>> with_slurm_topology(LaunchOptions(script="t.py"), {}).torchrun
        mappingproxy({})
    """
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


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    """The ``multigpu slurm`` parser."""
    p = _Parser(
        prog="multigpu slurm",
        description="Write an sbatch script that runs SCRIPT with `srun multigpu run` on every "
        "node of the allocation (one launcher per node; rendezvous from SLURM's variables).",
    )
    p.add_argument("--nodes", type=_positive, required=True, help="nodes to allocate")
    p.add_argument("--gpus-per-node", type=_non_negative, default=0, help="GPUs per node (0: CPU)")
    p.add_argument("--cpus-per-node", type=_positive, help="CPU cores per node")
    p.add_argument("--cpu", type=_positive, help="CPU processes per node (with --gpus-per-node 0)")
    p.add_argument("--time", default="01:00:00", help="time limit (01:00:00)")
    p.add_argument("--partition", help="partition (queue)")
    p.add_argument("--account", help="account to charge")
    p.add_argument("--job-name", help="job name (default: the script's name)")
    p.add_argument("--max-restarts", type=_non_negative, default=0, help="restarts per node agent")
    p.add_argument("-o", "--output", help="write the script here (default: stdout)")
    p.add_argument("--force", action="store_true", help="overwrite --output")
    p.add_argument("script", help="the training script")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    return p


def _positive(text: str) -> int:
    value = _non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative")
    return value


def sbatch_script(ns: argparse.Namespace) -> str:
    """The sbatch script for the parsed ``multigpu slurm`` options."""
    name = ns.job_name or Path(ns.script).stem
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --nodes={ns.nodes}",
        "# one `multigpu run` per node; it starts that node's workers",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --time={ns.time}",
        f"#SBATCH --output={name}-%j.out",
    ]
    if ns.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={ns.gpus_per_node}")
    if ns.cpus_per_node:
        lines.append(f"#SBATCH --cpus-per-task={ns.cpus_per_node}")
    lines += [f"#SBATCH --partition={ns.partition}"] if ns.partition else []
    lines += [f"#SBATCH --account={ns.account}"] if ns.account else []
    devices = f"--gpus {ns.gpus_per_node}" if ns.gpus_per_node else f"--cpu {ns.cpu or 1}"
    restarts = f" --max-restarts {ns.max_restarts}" if ns.max_restarts else ""
    command = " ".join(shlex.quote(a) for a in [ns.script, *ns.args])
    lines += [
        "",
        "set -euo pipefail",
        "# Each node's launcher reads SLURM's variables: --nnodes, --node-rank, the first host of",
        "# SLURM_JOB_NODELIST as the rendezvous address and a port derived from the job id.",
        "# Export MASTER_ADDR / MASTER_PORT to override them.",
        f"srun --ntasks-per-node=1 multigpu run {devices}{restarts} {command}",
        "",
    ]
    return "\n".join(lines)


def slurm_main(argv: Sequence[str]) -> int:
    """Entry point of ``multigpu slurm``; returns the exit code."""
    try:
        ns = build_parser().parse_args(list(argv))
        if ns.gpus_per_node and ns.cpu:
            raise UsageError(
                f"--cpu {ns.cpu} with --gpus-per-node {ns.gpus_per_node}: expected one of "
                "them; use --gpus-per-node for GPU nodes, --cpu for CPU-only nodes"
            )
        text = sbatch_script(ns)
        if ns.output is None:
            sys.stdout.write(text)
            return 0
        out = Path(ns.output)
        if out.exists() and not ns.force:
            raise UsageError(f"{out} exists; expected a new path; pass --force to overwrite it")
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(text)
        tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR)
        os.replace(tmp, out)
        print(f"wrote {out}; submit it with: sbatch {shlex.quote(str(out))}")
        return 0
    except UsageError as e:
        print(f"multigpu slurm: error: {e}", file=sys.stderr)
        return 2

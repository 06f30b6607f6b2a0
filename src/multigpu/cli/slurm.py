"""``multigpu slurm``: write the sbatch script that runs ``srun multigpu run`` on every node of an
allocation (one launcher per node; each reads SLURM's variables: ``multigpu.launch.slurm``)."""

from __future__ import annotations

import argparse
import shlex
import stat
from collections.abc import Sequence
from pathlib import Path

from multigpu.cli.output_file import print_or_write
from multigpu.common.arguments import Parser, whole_arg
from multigpu.errors import UsageError


def build_parser() -> argparse.ArgumentParser:
    """The ``multigpu slurm`` parser."""
    p = Parser(
        prog="multigpu slurm",
        description="Write an sbatch script that runs SCRIPT with `srun multigpu run` on every "
        "node of the allocation (one launcher per node; rendezvous from SLURM's variables).",
    )
    p.add_argument("--nodes", type=whole_arg(1), required=True, help="nodes to allocate")
    p.add_argument("--gpus-per-node", type=whole_arg(0), default=0, help="GPUs per node (0: CPU)")
    p.add_argument("--cpus-per-node", type=whole_arg(1), help="CPU cores per node")
    p.add_argument(
        "--cpu", type=whole_arg(1), help="CPU processes per node (with --gpus-per-node 0)"
    )
    p.add_argument("--time", default="01:00:00", help="time limit (01:00:00)")
    p.add_argument("--partition", help="partition (queue)")
    p.add_argument("--account", help="account to charge")
    p.add_argument("--job-name", help="job name (default: the script's name)")
    p.add_argument("--max-restarts", type=whole_arg(0), default=0, help="restarts per node agent")
    p.add_argument("-o", "--output", help="write the script here (default: stdout)")
    p.add_argument("--force", action="store_true", help="overwrite --output")
    p.add_argument("script", help="the training script")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    return p


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
    ns = build_parser().parse_args(list(argv))
    if ns.gpus_per_node and ns.cpu:
        raise UsageError(
            f"--cpu {ns.cpu} with --gpus-per-node {ns.gpus_per_node}: expected one of "
            "them; use --gpus-per-node for GPU nodes, --cpu for CPU-only nodes"
        )
    text = sbatch_script(ns)
    out = print_or_write(text, ns.output, force=ns.force, option="--output")
    if out is not None:
        out.chmod(out.stat().st_mode | stat.S_IXUSR)  # runnable as well as sbatch-able
        print(f"wrote {out}; submit it with: sbatch {shlex.quote(str(out))}")
    return 0

"""The parsers of the launching commands (argparse only): ``multigpu run``, ``multigpu train``'s
launch options, and the top-level ``multigpu`` parser with its subcommands.

``multigpu run`` is torchrun's own parser (``torch.distributed.run.get_args_parser``) with
multigpu's options added, so every torchrun flag keeps its name, spellings and meaning.

Environment variables read: torchrun's ``PET_*`` option defaults (through its parser).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

from multigpu.arguments import Parser, cpu_count_arg, seconds_arg
from multigpu.launch.options import BACKENDS, LaunchOptions
from multigpu.launch.plan import CPU_DEFAULT_WHY
from multigpu.launch.train import TRAIN_DESTS, TRAIN_MODULE

PROG = "multigpu"
# Our own dests: everything else the run parser produces is torchrun's.
_OWN_ARGS = frozenset(
    {"gpus", "cpu", "backend", "dry_run", "command", "training_script", "training_script_args"}
) | {"help", "json", "iface", "timeout"}

DEVICE_HELP = (
    "Devices. Default: every free GPU when the machine has GPUs; on a CPU-only machine ONE "
    f"process using all cores, because {CPU_DEFAULT_WHY}. --cpu N asks for N processes."
)


def _torchrun_parser() -> argparse.ArgumentParser:
    # Imported here: torch.distributed.run imports torch, which `multigpu gpus` does not need.
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            # Only what the user typed lands in the namespace, so "--nproc-per-node 1" given
            # explicitly can be told apart from torchrun's default of 1.
            action.default = argparse.SUPPRESS
    return parser


def _add_multigpu_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("multigpu options", DEVICE_HELP)
    group.add_argument(
        "--gpus",
        metavar="auto|N|i,j",
        help="use these GPUs: auto (all free ones), N (the N with most free memory) or a list "
        "of indices; they are locked for the run and exported as CUDA_VISIBLE_DEVICES",
    )
    group.add_argument(
        "--cpu",
        type=cpu_count_arg,
        metavar="N|auto",
        help="run N processes on the CPU (gloo), sharing the cores (OMP_NUM_THREADS = cores // N); "
        "auto: the split `multigpu bench scaling` measured fastest here (else 1 process)",
    )
    group.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="process-group backend for the workers (default auto: nccl on GPUs, gloo on CPU)",
    )
    group.add_argument(
        "--iface",
        metavar="NAME",
        help="network interface that connects the nodes: gloo and NCCL use it "
        "(GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME) and the agent advertises its address "
        "(--local-addr) unless given",
    )
    group.add_argument(
        "--timeout",
        type=seconds_arg,
        metavar="SECONDS",
        help="bound on every wait: the workers' collectives (MULTIGPU_TIMEOUT) and the "
        "launcher's rendezvous join, store calls and exit barrier (default MULTIGPU_TIMEOUT "
        "or 300)",
    )
    group.add_argument(
        "--dry-run",
        "--dry_run",
        action="store_true",
        help="print the plan (devices, processes, threads, torchrun arguments, environment) "
        "and start nothing",
    )


def build_run_parser(prog: str = f"{PROG} run") -> Parser:
    """The parser of ``multigpu run``: torchrun's options plus ``--gpus/--cpu/--backend/--dry-run``.

    It takes torchrun's options as torchrun does, shortened ones included (``--nproc-per 2``);
    every other parser takes whole names only (``arguments.Parser``).
    """
    parser = Parser(
        prog=prog,
        parents=[_torchrun_parser()],
        add_help=False,
        allow_abbrev=True,
        description="Run a training script (or -m module) on every GPU, on N CPU processes, or "
        "on many machines, through torchrun's elastic agent. All torchrun options work as in "
        "torchrun. On one node without rendezvous options, --standalone is added (free port).",
    )
    _add_multigpu_options(parser)
    return parser


def build_train_parser() -> argparse.ArgumentParser:
    """The launch options of ``multigpu train`` (the training options belong to the job)."""
    parser = Parser(
        prog=f"{PROG} train",
        add_help=False,
        usage=f"{PROG} train [launch options] [training options]",
        description=f"Train a built-in job through the launcher: --model digits (the default, "
        f"{TRAIN_MODULE}) or --model lm (a small GPT). "
        "Launch options are listed here; any other option goes to the job. --strategy dp runs "
        "ONE process that sees all chosen GPUs (DataParallel).",
    )
    parser.add_argument("-h", "--help", action="store_true", help="show this help and exit")
    launch = parser.add_argument_group("launch options (torchrun's)")
    for action in _torchrun_parser()._actions:
        if action.dest in TRAIN_DESTS:
            launch._add_action(action)
    _add_multigpu_options(parser)
    return parser


def build_parser() -> argparse.ArgumentParser:
    """The top-level ``multigpu`` parser with its subcommands."""
    parser = Parser(prog=PROG, description="Run PyTorch training on all GPUs, CPUs or machines.")
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="{run,train,verify,doctor,bench,estimate,ckpt,slurm,gpus}",
    )
    run = build_run_parser()
    sub.add_parser(
        "run",
        parents=[run],
        add_help=False,
        allow_abbrev=True,  # as build_run_parser
        help="run a script on all devices",
        description=run.description,
    )
    sub.add_parser("train", help="train a built-in example, digits or lm (see 'multigpu train -h')")
    sub.add_parser(
        "verify",
        help="check that a script gives the same results at every world size "
        "(see 'multigpu verify --help')",
    )
    sub.add_parser(
        "doctor",
        help="check this machine (or every node of a job) for distributed training, with the "
        "fixes (see 'multigpu doctor --help')",
    )
    sub.add_parser(
        "estimate",
        help="memory per rank of a model under ddp/fsdp, and what fits "
        "(see 'multigpu estimate --help')",
    )
    sub.add_parser("ckpt", help="inspect or convert checkpoints (see 'multigpu ckpt --help')")
    sub.add_parser("bench", help="collective bandwidth and scaling (see 'multigpu bench --help')")
    sub.add_parser("slurm", help="write an sbatch script (see 'multigpu slurm --help')")
    gpus = sub.add_parser("gpus", help="list this machine's GPUs")
    gpus.add_argument("--json", action="store_true", help="print a JSON list")
    return parser


def options_from_namespace(
    ns: argparse.Namespace, *, script: str, script_args: Sequence[str], one_process: bool = False
) -> LaunchOptions:
    """Make LaunchOptions from a parsed namespace (torchrun options = all dests not ours)."""
    values: dict[str, Any] = vars(ns)
    torchrun = {k: v for k, v in values.items() if k not in _OWN_ARGS}
    return LaunchOptions(
        script=script,
        script_args=tuple(script_args),
        gpus=values.get("gpus"),
        cpu=values.get("cpu"),
        backend=values.get("backend") or "auto",
        dry_run=bool(values.get("dry_run")),
        iface=values.get("iface"),
        timeout=values.get("timeout"),
        one_process=one_process,
        torchrun=MappingProxyType(torchrun),
    )

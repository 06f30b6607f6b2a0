"""The ``multigpu`` command (argparse only): run, train, verify, doctor, bench, estimate, ckpt,
slurm, sky, k8s, gpus. ``pyproject``'s ``[project.scripts]`` and ``python -m multigpu`` call
``main``.

The parsers of the launching commands are here: ``multigpu run`` is torchrun's own parser
(``torch.distributed.run.get_args_parser``) with multigpu's options added, so every torchrun
flag keeps its name, spellings and meaning; ``multigpu train`` takes some of its launch options.

User errors print one line, ``multigpu: error: ...``, and exit with 2; never a traceback.

Environment variables read: ``MULTIGPU_LOG_LEVEL`` (the launcher's log level, default INFO);
torchrun's ``PET_*`` option defaults (through its parser); every ``MULTIGPU_*`` variable the
workers read, checked before they start (``launch.env_checks``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from multigpu.cli.args import split_own_args
from multigpu.common import variables
from multigpu.common.arguments import Parser, cpu_count_arg, options_from, seconds_arg, whole_arg
from multigpu.common.quick_exit import skip_final_collection
from multigpu.errors import LaunchError, UsageError
from multigpu.launch import train, train_outputs
from multigpu.launch.options import BACKENDS, LaunchOptions, parse_nnodes
from multigpu.launch.plan import CPU_DEFAULT_WHY, LaunchPlan

PROG = "multigpu"
# Our own dests: everything else the run parser produces is torchrun's.
_OWN_ARGS = frozenset(
    {"gpus", "cpu", "backend", "dry_run", "iface", "timeout", "help", "json", "command"}
    | {"replicas", "lighthouse", "replica_group"}
    | {"training_script", "training_script_args"}
)

SUBCOMMANDS = {
    "verify": "check that a script gives the same results at every world size",
    "doctor": "check this machine (or every node of a job) for distributed training, with the "
    "fixes",
    "estimate": "memory per rank of a model under ddp/fsdp, and what fits",
    "ckpt": "inspect or convert checkpoints",
    "bench": "collective bandwidth and scaling",
    "slurm": "write an sbatch script",
    "sky": "write a SkyPilot task YAML (one `multigpu run` per node)",
    "k8s": "write a Kubernetes TrainJob or PyTorchJob (one `multigpu run` per pod)",
}
"""The subcommands whose module ``multigpu.cli.NAME`` has ``NAME_main(argv) -> exit code``, and
their line in ``multigpu --help``."""

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
        help="run N processes on the CPU (gloo), sharing the cores (OMP_NUM_THREADS = cores // N) "
        "on oneTBB's allocator where the tbb package is installed (MULTIGPU_CPU_ALLOCATOR); "
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
        "--replicas",
        type=whole_arg(1),
        metavar="R",
        help="R replica groups, each its own torchrun agent and process group, averaged per "
        "step by torchft: a failed group is left out of the steps until its agent restarts it "
        "and it heals from a live one (docs/fault-tolerance.md; needs pip install multigpu[ft])",
    )
    group.add_argument(
        "--lighthouse",
        metavar="HOST:PORT",
        help="with --replicas on several nodes: the torchft lighthouse every group meets at; "
        "the node whose address HOST is starts it there (default: one on 127.0.0.1)",
    )
    group.add_argument(
        "--replica-group",
        metavar="G[,G]",
        help="with --lighthouse: the replica groups (0..R-1) this node starts (default: all R)",
    )
    group.add_argument(
        "--dry-run",
        "--dry_run",
        action="store_true",
        help="print the plan (devices, processes, threads, torchrun arguments, environment) "
        "and start nothing",
    )


def _add_torchrun_options(parser: argparse.ArgumentParser, dests: frozenset[str] | None) -> None:
    """torchrun's options (those of ``dests``; all when None), under their own heading after
    multigpu's; its positionals (the script and its arguments) as they are."""
    if dests is None:
        about = (
            "torchrun's own, with its names, spellings (--nproc_per_node too) and meanings; "
            "shortened as torchrun allows (--nproc-per 2)."
        )
    else:
        about = "the torchrun options multigpu train takes, with torchrun's names and meanings."
    group = parser.add_argument_group("torchrun options", about)
    for action in _torchrun_parser()._actions:
        if action.dest == "help" or (dests is not None and action.dest not in dests):
            continue
        if action.option_strings:
            group._add_action(action)
        elif dests is None:
            parser._add_action(action)  # training_script, training_script_args


def build_run_parser(prog: str = f"{PROG} run") -> Parser:
    """The parser of ``multigpu run``: ``--gpus/--cpu/--backend/--dry-run/...`` first, then
    every torchrun option under its own heading.

    It takes torchrun's options as torchrun does, shortened ones included (``--nproc-per 2``);
    every other parser takes whole names only (``arguments.Parser``).
    """
    parser = Parser(
        prog=prog,
        allow_abbrev=True,
        usage=f"{prog} [multigpu options] [torchrun options] script.py [args]\n"
        f"       {prog} [multigpu options] [torchrun options] -m module [args]",
        description="Run a training script (or -m module) on every GPU, on N CPU processes, or "
        "on many machines, through torchrun's elastic agent. All torchrun options work as in "
        "torchrun. On one node without rendezvous options, --standalone is added (free port).",
    )
    _add_multigpu_options(parser)
    _add_torchrun_options(parser, None)
    return parser


def build_train_parser() -> argparse.ArgumentParser:
    """The launch options of ``multigpu train`` (the training options belong to the job)."""
    parser = Parser(
        prog=f"{PROG} train",
        add_help=False,
        usage=f"{PROG} train [--model digits|lm] [launch options] [training options]",
        description=f"Train a built-in job through the launcher: --model digits (the default, "
        f"{train.TRAIN_MODULE}) or --model lm (a small GPT). "
        "Launch options are listed here; any other option goes to the job. --strategy dp runs "
        "ONE process that sees all chosen GPUs (DataParallel).",
    )
    parser.add_argument("-h", "--help", action="store_true", help="show this help and exit")
    _add_multigpu_options(parser)
    _add_torchrun_options(parser, train.TRAIN_DESTS)
    return parser


def build_parser() -> argparse.ArgumentParser:
    """The top-level ``multigpu`` parser with its subcommands."""
    parser = Parser(prog=PROG, description="Run PyTorch training on all GPUs, CPUs or machines.")
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="{run,train,verify,doctor,bench,estimate,ckpt,slurm,sky,k8s,gpus}",
    )
    run = build_run_parser()
    sub.add_parser(
        "run",
        parents=[run],
        add_help=False,
        allow_abbrev=True,  # as build_run_parser
        help="run a script on all devices",
        usage=run.usage,
        description=run.description,
    )
    sub.add_parser("train", help="train a built-in example, digits or lm (see 'multigpu train -h')")
    for name, what in SUBCOMMANDS.items():
        sub.add_parser(name, help=f"{what} (see '{PROG} {name} --help')")
    gpus = sub.add_parser("gpus", help="list this machine's GPUs")
    gpus.add_argument("--json", action="store_true", help="print a JSON list")
    return parser


def options_from_namespace(
    ns: argparse.Namespace, *, script: str, script_args: Sequence[str], one_process: bool = False
) -> LaunchOptions:
    """Make LaunchOptions from a parsed namespace (torchrun options = all dests not ours)."""
    torchrun = {k: v for k, v in vars(ns).items() if k not in _OWN_ARGS}
    return options_from(
        ns,
        LaunchOptions,
        script=script,
        script_args=tuple(script_args),
        one_process=one_process,
        torchrun=MappingProxyType(torchrun),
    )


def _train(argv: Sequence[str]) -> int:
    parser = build_train_parser()
    launch_argv, job_argv = split_own_args(argv, parser._actions)
    model, job_argv = train.choose_model(job_argv)  # --model digits (default) | lm
    ns = parser.parse_args(launch_argv)
    if ns.help:
        sys.stdout.write(parser.format_help() + "\n" + train.training_help(model))
        return 0
    # No --out: a fresh runs/MODEL/N, decided here once for every restart of this launch.
    nnodes = str(getattr(ns, "nnodes", "1"))
    job_argv, chosen = train_outputs.default_outputs(
        model, job_argv, nnodes=nnodes, rdzv_id=getattr(ns, "rdzv_id", None)
    )
    # The job's own parser: a bad option refused here, once, before anything starts.
    single_node = nnodes in ("1", "1:1")
    train.parse_job_args(model, job_argv, single_node=single_node)
    # Checks that need no device: before the GPUs are chosen, so that a busy GPU cannot hide
    # a mistake in the options (seen on a GPU machine whose one GPU another job held).
    train.check_checkpoint_options(job_argv)
    train.check_strategy_options(job_argv)
    # Held by the launcher that writes it: the replica groups' parent, for its groups.
    if single_node and not _wants_replicas(ns) and not os.environ.get("MULTIGPU_REPLICA_GROUP"):
        train_outputs.check_out_free(job_argv)
    ns.module = True  # torchrun -m
    options = options_from_namespace(
        ns,
        script=train.TRAIN_MODULES[model],
        script_args=job_argv,
        one_process=train.wants_one_process(job_argv),
    )
    if _wants_replicas(ns):
        rest = ["--model", model, *job_argv]
        return _replicas("train", ns, launch_argv, rest, options, chosen=chosen)
    # Imported only now: a refused flag above costs no more than torchrun's parser.
    from multigpu.launch.env_checks import check_worker_environment
    from multigpu.launch.run import multigpu_run

    def check(plan: LaunchPlan) -> None:
        check_worker_environment(plan)
        low, high = parse_nnodes(str(options.torchrun.get("nnodes", "1")))
        if low == high:  # an elastic node count has no fixed world size to check against
            train.check_batch_size(job_argv, plan.nproc_per_node * low, model)
            train.check_pipeline_options(job_argv, plan.nproc_per_node * low, model)
        if not options.dry_run:  # the last check: nothing is created for a refused run
            if chosen is not None:
                train_outputs.claim_run_dir(chosen, shared=not single_node)
            if single_node and not os.environ.get("MULTIGPU_REPLICA_GROUP"):
                train_outputs.hold_out(job_argv)
            train_outputs.announce(job_argv, chosen)

    return multigpu_run(options, check=check)


def _wants_replicas(ns: argparse.Namespace) -> bool:
    ours = ("replicas", "lighthouse", "replica_group")
    return any(getattr(ns, d, None) is not None for d in ours)


def _quiet_native_logs(run: Callable[..., int]) -> Callable[..., int]:
    """``run`` with c10d's C++ warnings and torchft's info lines off in this process (unless the
    user set their levels), the environment as it was afterwards.

    The replica groups' launcher hosts the job's record (a TCPStore) and may host the
    lighthouse: c10d warned "The hostname of the client socket cannot be retrieved" twice per
    node where the nodes' addresses have no names, and torchft logs every quorum; nothing a
    user acts on. The C++ level is read when torch is imported, on the way: set first, put back
    after (a caller's process, e.g. a test calling main(), keeps its environment). The children
    get the same (``launch/replica_groups.py``).
    """
    quiet = {"TORCH_CPP_LOG_LEVEL": "ERROR", "RUST_LOG": "error"}

    @functools.wraps(run)
    def quietly(*args: Any, **kwargs: Any) -> int:
        saved = {name: os.environ.get(name) for name in quiet}
        for name, value in quiet.items():
            os.environ.setdefault(name, value)
        try:
            return run(*args, **kwargs)
        finally:
            for name, before in saved.items():
                if before is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = before

    return quietly


@_quiet_native_logs
def _replicas(
    command: str,
    ns: argparse.Namespace,
    own: list[str],
    rest: list[str],
    options: LaunchOptions,
    *,
    chosen: Path | None = None,
) -> int:
    """``--replicas``: checked here (exit 2, nothing started), then one launcher per group
    (``chosen``: ``multigpu train``'s output directory when it chose one)."""
    from multigpu.common.host import usable_cores
    from multigpu.launch.env_checks import check_worker_environment
    from multigpu.launch.replica_groups import (
        check_iface,
        check_no_rendezvous,
        check_one_node_per_group,
        check_torchft,
        plan_replicas,
        run_groups,
    )
    from multigpu.launch.run import prepare

    plan = plan_replicas(ns.replicas, ns.lighthouse, ns.replica_group)
    check_one_node_per_group(options.torchrun, os.environ)  # PET_NNODES=2: refused too
    check_no_rendezvous(options.torchrun, plan)
    check_iface(plan, options.iface)
    if command == "train":
        train.check_replica_options(rest)
        if len(plan.here) == plan.groups:  # every group here (on many nodes, each its own)
            train_outputs.check_out_free(rest[2:])
    if not options.dry_run:
        check_torchft()
    with prepare(options) as checked:  # the checks of a plain run: script, devices, variables
        check_worker_environment(checked)
        if command == "train":  # rest: --model MODEL, then the job's arguments
            train.check_batch_size(
                rest[2:], checked.nproc_per_node * plan.groups, rest[1], groups=plan.groups
            )
        threads = max(1, usable_cores() // (checked.nproc_per_node * len(plan.here)))
        if options.dry_run:
            print(checked.describe(), flush=True)
            print(f"replicas:  {plan.groups} group(s), {len(plan.here)} started here, each as "
                  f"above with {threads} thread(s) per process", flush=True)  # fmt: skip
            return 0
        if command == "train":  # the groups write to one place: said once, here
            if chosen is not None:
                train_outputs.claim_run_dir(chosen, shared=False)
            if len(plan.here) == plan.groups:  # every group here: they write to one place
                train_outputs.hold_out(rest[2:])
            train_outputs.announce(rest[2:], chosen)
    return run_groups(command, own + rest, plan, threads=threads, timeout_s=checked.timeout_s)


NO_GPU = "no GPU found; CPU processes are available with --cpu N"


def _show_gpus(*, as_json: bool = False) -> int:
    """``multigpu gpus``: print the GPUs (``format_gpu_table`` or a JSON list); exit code 0.

    Environment variables read: those ``multigpu.gpus.list_gpus`` reads.
    """
    from multigpu.gpus import format_gpu_table, list_gpus

    gpus = list_gpus()
    if as_json:
        print(json.dumps([dataclasses.asdict(g) for g in gpus], indent=2, default=str))
        if not gpus:
            print(NO_GPU, file=sys.stderr)  # stdout stays valid JSON
    else:
        print(format_gpu_table(gpus).rstrip("\n") if gpus else NO_GPU)
    return 0


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (tests and callers may swap it)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def _configure_logging() -> None:
    # On "multigpu", so that the GPU claim's messages (which GPU is locked by whom) show too.
    # propagate stays on: a caller's own handlers (pytest's capture included) keep working.
    logger = logging.getLogger("multigpu")
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter(f"{PROG}: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(variables.log_level(os.environ))  # a bad level: one line, exit 2


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``multigpu`` and ``python -m multigpu``; returns the exit code.

    0 on success, 1 when a worker failed, 2 on a usage error (one line on stderr).
    """
    args = sys.argv[1:] if argv is None else list(argv)
    skip_final_collection()  # 0.5 s of CPU at the launcher's exit (torch is imported)
    try:
        _configure_logging()
        if args and args[0] == "train":
            return _train(args[1:])
        if args and args[0] in SUBCOMMANDS:  # imported only when asked for: a fast --help
            module = importlib.import_module(f"multigpu.cli.{args[0]}")
            return int(getattr(module, f"{args[0]}_main")(args[1:]))
        ns = build_parser().parse_args(args)
        if ns.command == "gpus":
            return _show_gpus(as_json=ns.json)
        from multigpu.launch.env_checks import check_worker_environment
        from multigpu.launch.run import multigpu_run

        options = options_from_namespace(
            ns, script=ns.training_script, script_args=ns.training_script_args
        )
        if _wants_replicas(ns):
            cut = len(args) - len(ns.training_script_args) - 1  # the launcher's options end
            return _replicas("run", ns, args[1:cut], args[cut:], options)
        return multigpu_run(options, check=check_worker_environment)
    except (UsageError, LaunchError) as e:
        sys.stderr.write(f"{PROG}: error: {e}\n")
        return 2 if isinstance(e, UsageError) else 1
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    except KeyboardInterrupt:  # Ctrl-C before the agent took over its handling
        sys.stderr.write(f"{PROG}: stopped by Ctrl-C (SIGINT)\n")
        return 130

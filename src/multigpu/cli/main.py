"""The ``multigpu`` command (argparse only): run, train, verify, doctor, bench, estimate, ckpt,
slurm, gpus. ``pyproject``'s ``[project.scripts]`` and ``python -m multigpu`` call ``main``.

User errors print one line, ``multigpu: error: ...``, and exit with 2; never a traceback.

Environment variables read: ``MULTIGPU_LOG_LEVEL`` (the launcher's log level, default INFO);
torchrun's ``PET_*`` option defaults (through its parser); every ``MULTIGPU_*`` variable the
workers read, checked before they start (``launch.env_checks``).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

from multigpu import variables
from multigpu.cli.args import split_own_args
from multigpu.cli.launch_parsers import (
    PROG,
    build_parser,
    build_train_parser,
    options_from_namespace,
)
from multigpu.errors import LaunchError, UsageError
from multigpu.launch.plan import LaunchPlan


def _train(argv: Sequence[str]) -> int:
    from multigpu.launch.options import parse_nnodes
    from multigpu.launch.train import (
        TRAIN_MODULES,
        check_batch_size,
        check_checkpoint_options,
        check_pipeline_options,
        check_strategy_options,
        choose_model,
        parse_job_args,
        training_help,
        wants_one_process,
    )

    parser = build_train_parser()
    launch_argv, job_argv = split_own_args(argv, parser._actions)
    model, job_argv = choose_model(job_argv)  # --model digits (default) | lm
    ns = parser.parse_args(launch_argv)
    if ns.help:
        sys.stdout.write(parser.format_help() + "\ntraining options:\n" + training_help(model))
        return 0
    # The job's own parser: a bad option refused here, once, before anything starts.
    parse_job_args(model, job_argv, single_node=str(getattr(ns, "nnodes", "1")) in ("1", "1:1"))
    # Checks that need no device: before the GPUs are chosen, so that a busy GPU cannot hide
    # a mistake in the options (seen on a GPU machine whose one GPU another job held).
    check_checkpoint_options(job_argv)
    check_strategy_options(job_argv)
    options = options_from_namespace(
        ns,
        script=TRAIN_MODULES[model],
        script_args=job_argv,
        one_process=wants_one_process(job_argv),
    )
    with_module = MappingProxyType({**options.torchrun, "module": True})  # torchrun -m
    # Imported only now: a refused flag above costs no more than torchrun's parser.
    from multigpu.launch.env_checks import check_worker_environment
    from multigpu.launch.run import multigpu_run

    def check(plan: LaunchPlan) -> None:
        check_worker_environment(plan)
        low, high = parse_nnodes(str(options.torchrun.get("nnodes", "1")))
        if low == high:  # an elastic node count has no fixed world size to check against
            check_batch_size(job_argv, plan.nproc_per_node * low, model)
            check_pipeline_options(job_argv, plan.nproc_per_node * low, model)

    return multigpu_run(dataclasses.replace(options, torchrun=with_module), check=check)


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


_SUBCOMMANDS = ("verify", "doctor", "slurm", "bench", "estimate", "ckpt")
"""Subcommands whose module ``multigpu.cli.NAME`` has ``NAME_main(argv) -> exit code``."""


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``multigpu`` and ``python -m multigpu``; returns the exit code.

    0 on success, 1 when a worker failed, 2 on a usage error (one line on stderr).
    """
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        _configure_logging()
        if args and args[0] == "train":
            return _train(args[1:])
        if args and args[0] in _SUBCOMMANDS:  # imported only when asked for: a fast --help
            module = importlib.import_module(f"multigpu.cli.{args[0]}")
            return int(getattr(module, f"{args[0]}_main")(args[1:]))
        ns = build_parser().parse_args(args)
        if ns.command == "gpus":
            from multigpu.launch.listing import show_gpus

            return show_gpus(as_json=ns.json)
        from multigpu.launch.env_checks import check_worker_environment
        from multigpu.launch.run import multigpu_run

        options = options_from_namespace(
            ns, script=ns.training_script, script_args=ns.training_script_args
        )
        return multigpu_run(options, check=check_worker_environment)
    except (UsageError, LaunchError) as e:
        sys.stderr.write(f"{PROG}: error: {e}\n")
        return 2 if isinstance(e, UsageError) else 1
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0

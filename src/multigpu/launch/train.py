"""``multigpu train``: a built-in job (``--model digits``, default, or ``lm``) via the launcher.

The command line mixes launch options (``--cpu 2``, ``--max-restarts 1``) and training options
(``--epochs 3``); launch options are taken out by name, ``--model`` chooses the job's module, and
everything else goes to the job unchanged and in order. The launcher never imports a job, only
its parser (``digits_parser``, ``lm_parser``: no torch), with which it refuses the job's
arguments before any worker starts (``parse_job_args``); the job's module is written here.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from types import MappingProxyType

from multigpu.common.lock_probe import holder_of, locked_message
from multigpu.errors import UsageError
from multigpu.examples import digits_parser, lm_parser
from multigpu.examples.job_cli import check_outputs

TRAIN_MODULES = MappingProxyType(
    {"digits": "multigpu.examples.digits", "lm": "multigpu.examples.lm"}
)
"""The module ``multigpu train --model NAME`` launches (``torchrun --module``)."""

DEFAULT_MODEL = "digits"
"""The job of ``multigpu train`` without ``--model``."""

TRAIN_MODULE = TRAIN_MODULES[DEFAULT_MODEL]
"""The module ``multigpu train`` launches without ``--model``."""

MODEL_SUMMARIES = MappingProxyType(
    {
        "digits": "a small CNN on scikit-learn's handwritten digits (the default)",
        "lm": "a small GPT on the bytes of Python's standard library, or on your files with "
        "--data (--strategy fsdp shards it)",
    }
)
"""One line on each built-in job, for ``multigpu train --help``."""

TRAIN_DESTS = frozenset(
    {
        "nproc_per_node",
        "nnodes",
        "node_rank",
        "rdzv_backend",
        "rdzv_endpoint",
        "rdzv_id",
        "rdzv_conf",
        "standalone",
        "max_restarts",
        "monitor_interval",
        "master_addr",
        "master_port",
        "local_addr",
        "log_dir",
        "redirects",
        "tee",
    }
)
"""torchrun options ``multigpu train`` understands; the rest of torchrun's belong to ``run``."""


JOB_PARSERS: MappingProxyType[str, Callable[[], argparse.ArgumentParser]] = MappingProxyType(
    {"digits": digits_parser.build_parser, "lm": lm_parser.build_parser}
)
"""Each job's option parser (the job parses its arguments with the same one)."""


def parse_job_args(
    model: str, job_args: Sequence[str], *, single_node: bool = True
) -> argparse.Namespace:
    """The job's arguments as the job will parse them, and its outputs checked writable.

    On several nodes only the checkpoint directory is checked here: the node that hosts rank 0,
    the one writing ``--out`` and ``--save``, is known only after the rendezvous (its rank 0
    checks them before training).

    Raises:
        UsageError: what the job's parser refuses (``--epochs 0``, ``--strategy bogus``, an
            unknown or abbreviated option), or an ``--out``/``--checkpoint-dir``/``--save`` that
            cannot be written; ``--data`` the LM job cannot read; one line, before any worker
            starts.
    """
    args = JOB_PARSERS[model]().parse_args(list(job_args))
    check_outputs(args, writes_outputs=single_node)
    if model == "lm":
        lm_parser.check_data(args)  # --data's paths and formats
    return args


def choose_model(job_args: Sequence[str]) -> tuple[str, list[str]]:
    """The job ``--model`` names (default digits) and the job's arguments without ``--model``.

    Raises:
        UsageError: ``--model`` without a value, or a name that is not a built-in job.
    """
    model = DEFAULT_MODEL
    rest: list[str] = []
    i = 0
    while i < len(job_args):
        token = job_args[i]
        if token == "--model" or token.startswith("--model="):
            if "=" in token:
                model = token.split("=", 1)[1]
            elif i + 1 < len(job_args):
                model, i = job_args[i + 1], i + 1
            else:
                model = ""
            if model not in TRAIN_MODULES:
                given = f"--model {model}" if model else "--model without a name"
                raise UsageError(
                    f"{given} is not a built-in job; expected one of {', '.join(TRAIN_MODULES)} "
                    "(e.g. multigpu train --model lm --cpu 2); run your own script with "
                    "multigpu run"
                )
        else:
            rest.append(token)
        i += 1
    return model, rest


def option_value(job_args: Sequence[str], name: str) -> str | None:
    """The last value given to option ``name`` (``--x V`` or ``--x=V``) in ``job_args``."""
    value: str | None = None
    for i, token in enumerate(job_args):
        if token.startswith(name + "="):
            value = token.split("=", 1)[1]
        elif token == name and i + 1 < len(job_args):
            value = job_args[i + 1]
    return value


def check_batch_size(
    job_args: Sequence[str], processes: int, model: str = DEFAULT_MODEL, *, groups: int = 1
) -> None:
    """Refuse, before anything starts, a global ``--batch-size`` the processes cannot share.

    Without ``--batch-size`` in ``job_args`` it checks ``model``'s default batch size.
    ``groups``: replica groups of ``processes / groups`` processes each (``--replicas``).
    """
    value = option_value(job_args, "--batch-size")
    try:
        batch = int(value) if value is not None else JOB_PARSERS[model]().get_default("batch_size")
    except ValueError:
        return  # the job's own parser says what is wrong with it
    if batch > 0 and batch % processes:
        low = max(processes, batch - batch % processes)
        among = (
            f"{groups} replica groups x {processes // groups} process(es)"
            if groups > 1
            else f"{processes} processes"
        )
        raise UsageError(
            f"--batch-size {batch} is not divisible by the {among} (it is the global batch, "
            f"split evenly); use a multiple of {processes}, e.g. {low} or {low + processes}"
        )


def check_checkpoint_options(job_args: Sequence[str]) -> None:
    """Refuse, before anything starts, checkpoint options the job would refuse after starting.

    The job checks the same (its own users may run it directly); checking here too means the
    one-line error comes before workers start and load the data.

    Raises:
        UsageError: ``--checkpoint-every`` without ``--out``/``--checkpoint-dir``; ``--resume
            never`` on a directory that holds checkpoints; ``--resume PATH`` that does not exist;
            a checkpoint directory another live run holds (``multigpu.common.lock_probe``).
    """
    every = option_value(job_args, "--checkpoint-every")
    given_dir = option_value(job_args, "--checkpoint-dir")
    out = option_value(job_args, "--out")
    resume = option_value(job_args, "--resume") or "auto"
    directory = Path(given_dir) if given_dir else (Path(out) / "checkpoints" if out else None)
    if every is not None and directory is None:
        raise UsageError(
            "--checkpoint-every was given without a place for the checkpoints; expected "
            "--out DIR (checkpoints go to DIR/checkpoints) or --checkpoint-dir DIR"
        )
    checkpointing = every is not None or given_dir is not None
    holder = holder_of(directory) if checkpointing and directory is not None else None
    if holder and directory is not None:  # the job's rank 0 refused it once workers started
        raise UsageError(
            locked_message(directory, holder, fix="give another --checkpoint-dir or --out")
        )
    if resume not in ("auto", "never"):
        if not checkpointing:
            raise UsageError(
                f"--resume {resume} needs checkpointing; expected --checkpoint-every N "
                "(and --out or --checkpoint-dir)"
            )
        if not Path(resume).is_dir():
            raise UsageError(
                f"--resume {resume}: no such checkpoint directory; expected auto, never or "
                "the path of a step-XXXXXXXX directory"
            )
    if resume == "never" and checkpointing and directory is not None and directory.is_dir():
        existing = sorted(p.name for p in directory.glob("step-*"))
        if existing:
            raise UsageError(
                f"--resume never, but {directory} already holds {existing[-1]}; expected an "
                "empty checkpoint directory: use --resume auto to continue that run, or "
                "another --checkpoint-dir / --out"
            )


def check_strategy_options(job_args: Sequence[str]) -> None:
    """Refuse, before anything starts, DDP's own options given to a strategy without DDP.

    Raises:
        UsageError: ``--compression`` (DDP's gradient all-reduce) with ``--strategy`` (or
            ``MULTIGPU_STRATEGY``) single, dp or fsdp (FSDP reduce-scatters shards: there is no
            DDP all-reduce to compress).
    """
    digits_parser.check_compression(
        option_value(job_args, "--strategy"), option_value(job_args, "--compression")
    )


def check_replica_options(job_args: Sequence[str]) -> None:
    """Refuse, before anything starts, a ``--strategy`` replica groups cannot replicate."""
    strategy = option_value(job_args, "--strategy")
    if strategy in ("pipeline", "tp", "dp"):
        raise UsageError(
            f"--strategy {strategy} with --replicas: replica groups replicate a data-parallel "
            "model; use --strategy ddp, fsdp or single inside each group, or leave --replicas out"
        )


def check_pipeline_options(job_args: Sequence[str], processes: int, model: str) -> None:
    """Refuse, before anything starts, ``--strategy pipeline`` options the job cannot build."""
    args = JOB_PARSERS[model]().parse_args(list(job_args))
    if model == "lm":
        lm_parser.check_pipeline(args, processes)
        lm_parser.check_checkpointing(args)
    else:  # digits: --strategy, else MULTIGPU_STRATEGY
        strategy = digits_parser.check_compression(args.strategy, args.compression)
        digits_parser.check_pipeline(args, processes, strategy)


def wants_one_process(job_args: Sequence[str]) -> bool:
    """True when the job is asked for ``--strategy dp`` (one process driving every GPU)."""
    return option_value(job_args, "--strategy") == "dp"


def training_help(model: str = DEFAULT_MODEL) -> str:
    """``--model``'s choices, then the job's own options (its ``--help`` without a usage block
    of its own: ``multigpu train --help`` has one, the launcher's)."""
    parser = JOB_PARSERS[model]()
    formatter = parser._get_formatter()
    formatter.start_section(f"training options (--model {model})")
    formatter.add_text(parser.description)
    formatter.end_section()
    pad = " " * 24  # argparse's column of option help
    choice = (
        f"  --model {{{','.join(TRAIN_MODULES)}}}   the built-in job; below: the options of "
        f"--model {model}\n"
        + "".join(f"{pad}{name}: {line}\n" for name, line in MODEL_SUMMARIES.items())
    )
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.dest != "help"]
        if actions:
            formatter.start_section(None)
            formatter.add_arguments(actions)
            formatter.end_section()
    text = formatter.format_help()
    head, _, rest = text.partition("\n\n")
    return head + "\n\n" + choice + rest

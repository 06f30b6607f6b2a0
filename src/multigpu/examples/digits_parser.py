"""The options of ``multigpu train`` (``--model digits``): a parser and nothing else.

No torch: the launcher parses the job's arguments with it before any worker starts, and the job
(``multigpu.examples.digits``) parses them again the same way.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from multigpu.common import variables
from multigpu.common.arguments import Parser, positive
from multigpu.common.choices import COMPRESSIONS, PRECISIONS, STRATEGY_NAMES
from multigpu.errors import UsageError
from multigpu.examples.job_cli import (
    add_checkpoint_options,
    add_compile_option,
    add_profile_option,
    add_seed_and_accumulation,
    add_tracking_option,
)

NO_DDP = ("single", "dp", "fsdp", "pipeline")
"""Strategies without DDP's gradient all-reduce: nothing for ``--compression`` to compress."""


def check_compression(
    strategy: str | None, compression: str | None, environ: Mapping[str, str] | None = None
) -> str:
    """The strategy the job will run (``--strategy``, else ``MULTIGPU_STRATEGY``, else auto),
    refused when ``--compression`` asks to compress an all-reduce it does not have.

    Example:
        >>> check_compression(None, "fp16", {"MULTIGPU_STRATEGY": "ddp"})
        'ddp'
    """
    name = strategy or variables.strategy(os.environ if environ is None else environ)
    if name in NO_DDP and compression not in (None, "none"):
        given = f"--strategy {name}" if strategy else f"MULTIGPU_STRATEGY={name}"
        raise UsageError(
            f"--compression {compression} compresses DDP's gradient all-reduce, which {given} "
            "does not have; use --strategy ddp (or auto), or leave out --compression"
        )
    return name


def build_parser() -> argparse.ArgumentParser:
    """The training options of the digits job (``multigpu train``'s default)."""
    p = Parser(
        prog="multigpu train",
        description="Train a small CNN on scikit-learn's handwritten digits on all local devices.",
    )
    p.add_argument("--epochs", type=positive(int), default=12, help="passes over the data (12)")
    p.add_argument(
        "--batch-size",
        type=positive(int),
        default=64,
        help="GLOBAL batch per optimizer step, split over the processes (64)",
    )
    p.add_argument("--eval-batch-size", type=positive(int), default=256, help="global eval batch")
    p.add_argument("--lr", type=positive(float), default=3e-3, help="Adam learning rate (3e-3)")
    add_seed_and_accumulation(p, seed="seed for every RNG (0)")
    p.add_argument("--precision", choices=PRECISIONS, default="32", help="32, bf16-mixed, 16-mixed")
    p.add_argument(
        "--strategy",
        choices=STRATEGY_NAMES,
        help="auto (ddp above one process), single, dp (legacy), ddp, fsdp (sharded), "
        "pipeline (2-4 processes, one stage of the CNN each); default MULTIGPU_STRATEGY, else "
        "auto",
    )
    p.add_argument(
        "--compression",
        choices=COMPRESSIONS,
        help="compress DDP's gradient all-reduce (default MULTIGPU_COMPRESSION, else none)",
    )
    add_profile_option(p)
    add_compile_option(p)
    add_checkpoint_options(
        p,
        every="save a checkpoint every N optimizer steps (to --checkpoint-dir or OUT/checkpoints)",
        resume="auto: continue from the newest complete checkpoint when there is one (default); "
        "never: start over (refused if checkpoints exist); or the path of one checkpoint",
    )
    add_tracking_option(p)
    p.add_argument("--save", help="path of the model's state dict (default OUT/model.pt)")
    p.add_argument(
        "--progress",
        choices=("bar", "lines", "off"),
        default="bar",
        help="rank-0 progress bar on a terminal, else one line per epoch",
    )
    return p


PIPELINE_STAGE_STARTS = ("conv2", "fc1", "fc2")
"""``--strategy pipeline``: the layers a stage begins with, one fewer than the stages (2
processes cut before ``fc1``: the convolutions, then the classifier; 4: one layer each)."""

PIPELINE_MICROBATCHES = 4
"""Micro-batches per batch under ``--strategy pipeline`` (fewer when the batch does not divide)."""


def pipeline_split_points(processes: int) -> list[str]:
    """The digits CNN's split points for one pipeline stage per process (2 to 4).

    Example:
        >>> pipeline_split_points(2), pipeline_split_points(3)
        (['fc1'], ['conv2', 'fc1'])
    """
    return {2: ["fc1"], 3: ["conv2", "fc1"]}.get(processes, list(PIPELINE_STAGE_STARTS))


def check_pipeline(args: argparse.Namespace, processes: int, strategy: str | None) -> None:
    """Refuse, before anything starts, a digits pipeline it cannot build (``strategy``: the one
    the job will run, from ``--strategy`` or ``MULTIGPU_STRATEGY``)."""
    if strategy != "pipeline":
        return
    stages = len(PIPELINE_STAGE_STARTS) + 1
    if not 2 <= processes <= stages:
        raise UsageError(
            f"--strategy pipeline on {processes} process(es): the digits CNN has {stages} layers, "
            f"one stage per process; expected 2 to {stages} processes (e.g. --cpu 2), or "
            "--model lm --strategy pipeline for a deeper model"
        )
    if args.precision != "32" or args.accumulation_steps != 1:
        given = (
            f"--precision {args.precision}"
            if args.precision != "32"
            else f"--accumulation-steps {args.accumulation_steps}"
        )
        raise UsageError(
            f"--strategy pipeline runs in fp32 without accumulation (the batch is cut into "
            f"micro-batches instead), and {given} was given; leave it out or use --strategy ddp"
        )

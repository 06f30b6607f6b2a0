"""The options of ``multigpu train --model lm``: a parser and nothing else.

No torch: the launcher parses the job's arguments with it before any worker starts, and the job
(``multigpu.examples.lm``, through ``lm_options``) parses them again the same way.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Mapping

from multigpu.common import variables
from multigpu.common.arguments import Parser, positive
from multigpu.common.choices import PIPELINE_SCHEDULES
from multigpu.common.text_sources import check_sources
from multigpu.errors import UsageError
from multigpu.examples.job_cli import (
    add_checkpoint_options,
    add_compile_option,
    add_profile_option,
    add_seed_and_accumulation,
    add_tracking_option,
)

DEFAULT_BATCH_SIZE = 32
"""Sequences per optimizer step, over all processes (the launcher checks it divides)."""

STRATEGIES = ("auto", "single", "ddp", "fsdp", "pipeline")
CHECKPOINTING_STRATEGIES = ("ddp", "fsdp")
"""The strategies that take ``--activation-checkpointing``."""


def checkpointing_arg(text: str) -> str | float:
    """``--activation-checkpointing``'s converter: ``full``, ``selective`` or a budget in (0, 1).

    Example:
        >>> checkpointing_arg("selective"), checkpointing_arg("0.5")
        ('selective', 0.5)
    """
    if text in ("full", "selective"):
        return text
    try:
        budget = float(text)
    except ValueError:
        budget = math.nan
    if not 0.0 < budget < 1.0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not full, selective or a memory budget in (0, 1) (the share of "
            "activations kept, with --compile), e.g. 0.5"
        )
    return budget


def build_parser() -> argparse.ArgumentParser:
    """The training options of the LM job."""
    p = Parser(
        prog="multigpu train --model lm",
        description="Train a small GPT on the bytes of Python's standard library (no download), "
        "or on your own text with --data, on all local devices; prints train and validation "
        "loss (nats per token) beside the unigram baseline, and tokens/s.",
    )
    add = p.add_argument
    add("--steps", type=positive(int), default=400, help="optimizer steps (400)")
    add(
        "--batch-size",
        type=positive(int),
        default=DEFAULT_BATCH_SIZE,
        help=f"GLOBAL sequences per optimizer step, split over processes ({DEFAULT_BATCH_SIZE})",
    )
    add("--block-size", type=positive(int), default=64, help="context length in bytes (64)")
    add("--n-layer", type=positive(int), default=4, help="transformer blocks (4)")
    add("--n-head", type=positive(int), default=4, help="attention heads (4)")
    add("--n-embd", type=positive(int), default=128, help="model width (128)")
    add(
        "--lr",
        type=positive(float),
        default=5e-3,
        help="AdamW peak learning rate, after a linear warm-up, cosine-decayed to a tenth (5e-3)",
    )
    add_seed_and_accumulation(p, seed="seed for every RNG and the data order (0)")
    add("--precision", choices=("32", "bf16-mixed"), default="32", help="32 or bf16-mixed")
    add(
        "--strategy",
        choices=STRATEGIES,
        default="auto",
        help="auto (ddp above one process), single, ddp, fsdp (each Block a shard unit), or "
        "pipeline (the blocks cut into one stage per process)",
    )
    add(
        "--schedule",
        choices=PIPELINE_SCHEDULES,
        default="1f1b",
        help="with --strategy pipeline: gpipe, 1f1b (default) or interleaved-1f1b (2 stages "
        "per process)",
    )
    add(
        "--microbatches",
        type=positive(int),
        default=4,
        help="with --strategy pipeline: micro-batches per batch (4; must divide --batch-size)",
    )
    add(
        "--activation-checkpointing",
        nargs="?",
        const="full",
        type=checkpointing_arg,
        metavar="POLICY",
        help="with --strategy fsdp or ddp: recompute activations in the backward, per block: "
        "full (the default policy: the whole block), selective (keep matmul and attention "
        "outputs, recompute the rest), or a memory budget such as 0.5 (the share of "
        "activations kept; needs --compile)",
    )
    add_compile_option(p)
    add(
        "--corpus-mb",
        type=positive(float),
        default=4.0,
        help="MB of standard-library source to read; the last 10%% is validation (4)",
    )
    add(
        "--data",
        nargs="+",
        metavar="PATH",
        help="train on these files instead: .txt (a document per file), .jsonl (a document per "
        "line, its --text-field) or .parquet (a document per row), or directories or globs of "
        "them; tokenized once into a cached token file and packed into --block-size sequences, "
        "targets that start a document left out of the loss",
    )
    add(
        "--tokenizer",
        metavar="NAME",
        help="with --data: a Hugging Face tokenizer (a directory, or a name in the local cache) "
        "whose EOS token ends each document; default: bytes (a vocabulary of 256)",
    )
    add(
        "--text-field",
        default="text",
        help="with --data: the JSON field or parquet column holding each document (text)",
    )
    add(
        "--data-cache",
        metavar="DIR",
        help="with --data: where token files are kept (default MULTIGPU_CACHE_DIR/tokens, else "
        "~/.cache/multigpu/tokens)",
    )
    add("--eval-every", type=positive(int), default=100, help="evaluate every N steps (100)")
    add(
        "--eval-windows",
        type=positive(int),
        default=256,
        help="validation windows per evaluation, spread evenly over the split (256)",
    )
    add_profile_option(p)
    add_checkpoint_options(
        p,
        every="save a checkpoint every N steps (to --checkpoint-dir or OUT/checkpoints)",
        resume="auto: continue from the newest complete checkpoint (default); never: start over "
        "(refused if checkpoints exist); or the path of one checkpoint",
    )
    add_tracking_option(p)
    add(
        "--progress",
        choices=("lines", "off"),
        default="lines",
        help="lines: one line per evaluation (default); off: the summary only",
    )
    return p


def check_pipeline(args: argparse.Namespace, processes: int) -> None:
    """Refuse, before anything starts, a pipeline the job cannot build on ``processes``."""
    if args.strategy != "pipeline":
        return
    # The strategy refuses both too (PipelineStrategy.validate, no_sync), but only once the
    # workers run; said here, the launcher refuses before any starts.
    if args.precision != "32":
        raise UsageError(
            f"--precision {args.precision} with --strategy pipeline is not supported; use "
            "--precision 32, or --strategy fsdp for mixed precision"
        )
    if args.accumulation_steps > 1:
        raise UsageError(
            f"--accumulation-steps {args.accumulation_steps} with --strategy pipeline: the "
            "pipeline already accumulates over its micro-batches; use --accumulation-steps 1 "
            f"and more --microbatches, e.g. --microbatches {args.microbatches * 2}"
        )
    if args.batch_size % args.microbatches:
        low = max(args.microbatches, args.batch_size - args.batch_size % args.microbatches)
        raise UsageError(
            f"--batch-size {args.batch_size} does not split into --microbatches "
            f"{args.microbatches} equal micro-batches; use a multiple of {args.microbatches}, "
            f"e.g. {low}, or other --microbatches"
        )
    per = 2 if args.schedule == "interleaved-1f1b" else 1
    if processes < 2:
        raise UsageError(
            "--strategy pipeline needs at least 2 processes (one stage each); run with --cpu 2 "
            "or on 2 GPUs, or use --strategy single"
        )
    if processes * per > args.n_layer:
        raise UsageError(
            f"--strategy pipeline on {processes} processes cuts the {args.n_layer} blocks into "
            f"{processes * per} stages: more stages than blocks; use --n-layer "
            f"{processes * per} or more, or fewer processes"
        )


def check_checkpointing(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> None:
    """Refuse, before anything starts, ``--activation-checkpointing`` where it cannot act: a
    strategy without it, or a memory budget without ``--compile`` (or ``MULTIGPU_COMPILE``)."""
    policy = args.activation_checkpointing
    if policy is None:
        return
    if args.strategy not in CHECKPOINTING_STRATEGIES:
        raise UsageError(
            f"--activation-checkpointing with --strategy {args.strategy}: expected --strategy "
            "fsdp or ddp (the strategies that checkpoint each block); add one or leave it out"
        )
    env = os.environ if environ is None else environ
    if isinstance(policy, float) and not (args.compile or variables.compile_backend(env)):
        raise UsageError(
            f"--activation-checkpointing {policy:g} is a memory budget, which only "
            "torch.compile's partitioner applies; add --compile, or use --activation-"
            "checkpointing selective or full"
        )


def check_data(args: argparse.Namespace) -> None:
    """Refuse, before anything starts, ``--data`` the job cannot read: a missing path, an unknown
    format, no text, parquet without pyarrow; and ``--tokenizer``/``--text-field`` without it."""
    if args.data is None:
        for name, value, default in (
            ("--tokenizer", args.tokenizer, None),
            ("--text-field", args.text_field, "text"),
            ("--data-cache", args.data_cache, None),
        ):
            if value != default:
                raise UsageError(
                    f"{name} {value} was given without --data; expected --data PATH... (the "
                    "files to train on), or leave it out"
                )
        return
    check_sources(args.data, args.tokenizer)

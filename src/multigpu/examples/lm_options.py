"""The options of ``multigpu train --model lm`` and what they turn into: a strategy, a schedule.

Kept out of ``lm.py`` so that the example file shows the model and the training loop only; the
parser itself is ``lm_parser`` (no torch: the launcher uses it too).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import multigpu
from multigpu.examples import lm_parser
from multigpu.examples.lm_data import Corpus
from multigpu.examples.lm_parser import build_parser as build_parser  # the job parses with it
from multigpu.session.context import Context

CHECKPOINT_EVERY = 100
"""Steps between checkpoints when only ``--checkpoint-dir`` is given (``multigpu train`` without
``--out`` gives it): 100, and the last step."""


def model_shape(args: argparse.Namespace) -> dict[str, int]:
    """The ``GPTConfig`` fields the options set."""
    return {k: getattr(args, k) for k in ("block_size", "n_layer", "n_head", "n_embd")}


def strategy(args: argparse.Namespace, block: type[nn.Module]) -> Any:
    """``--strategy`` as ``multigpu.init`` takes it: FSDP shards each ``block`` on its own."""
    if args.strategy == "pipeline":
        lm_parser.check_pipeline(args, int(os.environ.get("WORLD_SIZE", "1")))
        return multigpu.PipelineStrategy(  # traced with one batch of token ids
            example_input=torch.zeros(args.batch_size, args.block_size, dtype=torch.long),
            schedule=args.schedule,
            microbatches=args.microbatches,
            stages_per_process=2 if args.schedule == "interleaved-1f1b" else 1,
        )
    lm_parser.check_checkpointing(args)
    policy = args.activation_checkpointing or False
    if args.strategy == "ddp" and policy:
        return multigpu.DDPStrategy(activation_checkpointing=policy)
    if args.strategy != "fsdp":
        return args.strategy
    return multigpu.FSDPStrategy(blocks=(block,), activation_checkpointing=policy)


def warmup_cosine(args: argparse.Namespace) -> Callable[[int], float]:
    """The learning-rate factor of each step: a linear warm-up over the first 5 % of the steps,
    then a cosine decay to a tenth of ``--lr`` at the last step (for ``LambdaLR``).

    Example:
        >>> f = warmup_cosine(argparse.Namespace(steps=100))
        >>> [round(f(s), 3) for s in (0, 4, 5, 100)]
        [0.2, 1.0, 1.0, 0.1]
    """
    steps = int(args.steps)
    warmup = max(1, steps // 20)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, steps - warmup))
        return 0.1 + 0.45 * (1.0 + math.cos(math.pi * progress))

    return factor


def check_data(ctx: Context, args: argparse.Namespace, corpus: Corpus) -> None:
    """Refuse to train on corpora that differ between ranks, or too small for the options."""
    digests = ctx.gather(corpus.sha256)
    if len(set(digests)) > 1:
        ranks = [r for r, d in enumerate(digests) if d != digests[0]]
        raise multigpu.UsageError(
            f"ranks {ranks} read another corpus than rank 0 (a different Python standard "
            "library); expected the same Python version on every node"
        )
    train = (len(corpus.train) - 1) // args.block_size
    val = (len(corpus.val) - 1) // args.block_size
    if train < args.batch_size or val < ctx.world_size:
        raise multigpu.UsageError(
            f"--corpus-mb {args.corpus_mb} gives {train} training and {val} validation windows "
            f"of --block-size {args.block_size}; expected at least one --batch-size "
            f"({args.batch_size}) and one per process ({ctx.world_size}): raise --corpus-mb or "
            "lower --block-size / --batch-size"
        )

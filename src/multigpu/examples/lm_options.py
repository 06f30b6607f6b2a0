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
from multigpu.data import TokenFile, build_token_file
from multigpu.examples import lm_data, lm_parser
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


def data(ctx: Context, args: argparse.Namespace) -> lm_data.LMData:
    """What the job trains on: ``--data`` tokenized once (``token_file``), else the standard
    library's bytes; refused on every rank when ranks differ or it is too small for the options."""
    if args.data is None:
        corpus = lm_data.load_corpus(int(args.corpus_mb * 1e6))
        train = (len(corpus.train) - 1) // args.block_size
        val = (len(corpus.val) - 1) // args.block_size
        check_data(ctx, args, corpus.sha256, train, val)
        return lm_data.from_corpus(corpus, args.block_size, args.eval_windows, ctx.world_size)
    tokens = token_file(ctx, args)
    check_data(ctx, args, tokens.sha256, *lm_data.split_counts(len(tokens), args.block_size))
    return lm_data.from_token_file(tokens, args.block_size, args.eval_windows, ctx.world_size)


def token_file(ctx: Context, args: argparse.Namespace) -> TokenFile:
    """``--data`` as a token file: built by each node's local rank 0 (or found in the cache)
    while the node's other ranks wait, then opened by all. A build that fails is refused on
    every rank with its line. A corpus that takes longer than the collective timeout to tokenize
    is built beforehand with ``multigpu.data.build_token_file`` (the job then finds it)."""
    options = {"tokenizer": args.tokenizer, "text_field": args.text_field}
    options["cache_dir"] = args.data_cache
    problem = None
    if ctx.local_rank == 0:
        try:
            build_token_file(args.data, **options)
        except multigpu.UsageError as e:
            problem = str(e)
    said = [p for p in ctx.gather(problem) if p]  # the other ranks wait here for the build
    if said:
        raise multigpu.UsageError(said[0])
    return TokenFile(build_token_file(args.data, **options))  # in the cache now: nothing read


def check_data(ctx: Context, args: argparse.Namespace, sha256: str, train: int, val: int) -> None:
    """Refuse to train on data that differ between ranks, or too small for the options
    (``train`` and ``val``: the sequences of ``--block-size`` in each split)."""
    digests = ctx.gather(sha256)
    if len(set(digests)) > 1:
        ranks = [r for r, d in enumerate(digests) if d != digests[0]]
        if args.data is not None:
            raise multigpu.UsageError(
                f"ranks {ranks} tokenized other --data than rank 0 (other files or another "
                "tokenizer); expected the same files on every node"
            )
        raise multigpu.UsageError(
            f"ranks {ranks} read another corpus than rank 0 (a different Python standard "
            "library); expected the same Python version on every node"
        )
    if train < args.batch_size or val < ctx.world_size:
        given, more = (
            (f"--corpus-mb {args.corpus_mb}", "raise --corpus-mb")
            if args.data is None
            else ("--data", "give more text")
        )
        raise multigpu.UsageError(
            f"{given} gives {train} training and {val} validation windows "
            f"of --block-size {args.block_size}; expected at least one --batch-size "
            f"({args.batch_size}) and one per process ({ctx.world_size}): {more} or "
            "lower --block-size / --batch-size"
        )

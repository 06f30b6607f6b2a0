"""A small GPT on the bytes of Python's own standard library, or on your text (``--data``):
``multigpu train --model lm``.

Reads like nanoGPT on purpose: the model, then a training loop written against multigpu's public
API as a user would write it. Run it through the launcher (``multigpu train --model lm --cpu 2
[--strategy fsdp]``) or directly (``python -m multigpu.examples.lm``). The corpus needs no
download (``lm_data``); ``--data PATHS`` trains on your own files instead; options are in
``lm_options``, reports in ``lm_log``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

import multigpu
from multigpu.data import IGNORE_INDEX
from multigpu.examples import job_cli, lm_data, lm_options, outputs
from multigpu.examples.job_tracking import TrackedSteps, instruments
from multigpu.examples.lm_log import RunLog


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """The shape of the model (defaults: the model of ``multigpu train --model lm``)."""

    vocab_size: int = lm_data.VOCAB_SIZE  # tokens are bytes
    block_size: int = 64  # context length in tokens
    n_layer: int = 4  # transformer blocks
    n_head: int = 4  # attention heads per block (must divide n_embd)
    n_embd: int = 128  # width of the residual stream

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise multigpu.UsageError(
                f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}; expected a "
                f"width that is a multiple of the heads, e.g. {self.n_head * 32}"
            )


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)  # q, k, v in one matmul
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: the unit FSDP shards (``FSDPStrategy(blocks=(Block,))``)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Token + position embeddings, ``n_layer`` blocks, a final LayerNorm and a linear head.

    Only torch's layers hold parameters, each with its ``reset_parameters()``, so the model
    builds on ``torch.device("meta")`` and materializes by ``to_empty`` and those calls.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))  # logits (B, T, vocab)


def build_model(**overrides: Any) -> GPT:
    """The default model of ``multigpu train --model lm``, with ``GPTConfig`` fields overridden.

    Example:
        >>> with torch.device("meta"):
        ...     sum(p.numel() for p in build_model(n_layer=2).parameters())
        470528
    """
    return GPT(GPTConfig(**overrides))


def next_byte_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the logits (B, T, vocab) against the bytes that follow (B, T)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())


def next_token_loss_sum(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy over the targets that are not ``IGNORE_INDEX`` (document starts):
    with ``num_items`` = their count, the loss of a step is the mean over its real tokens."""
    return F.cross_entropy(
        logits.flatten(0, 1).float(), y.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
    )


def bubble_line(strategy: multigpu.PipelineStrategy, bubble: dict[str, Any]) -> str:
    """The pipeline's bubble in one line: measured per stage, and the schedule's own."""
    d = strategy.describe()
    measured = ", ".join(
        f"process {i} {b:.2f}" for i, b in enumerate(bubble["measured"]) if b is not None
    )
    return (
        f"pipeline bubble (idle fraction; measured: 1 - time in the stages' forward and "
        f"backward / training step time): {measured}; {d['schedule']} schedule with "
        f"{d['microbatches']} micro-batches on {d['stages']} stages: {bubble['schedule']:.2f} "
        "if every stage took the same time and sends were free"
    )


@torch.no_grad()
def evaluate(
    ctx: multigpu.Context, model: nn.Module, windows: Dataset[Any], batch_size: int
) -> float:
    """Mean cross-entropy (nats per token) over ``windows``' targets (those not masked), each
    counted once at any world size."""
    model.eval()
    total = torch.zeros(2, dtype=torch.float64)  # (sum of losses, tokens) on this rank
    for x, y in ctx.loader(windows, batch_size=batch_size, shuffle=False):
        loss = next_token_loss_sum(model(x), y)
        total += torch.tensor([float(loss), int((y != IGNORE_INDEX).sum())], dtype=torch.float64)
    model.train()
    loss_sum, tokens = ctx.all_reduce(total, op="sum").tolist()  # summed over ranks
    return loss_sum / tokens


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Train for ``args.steps`` optimizer steps; return the metrics (written to ``--out``)."""
    strategy = lm_options.strategy(args, Block)  # FSDP: each Block is a unit of its own
    with multigpu.init(
        strategy,
        seed=args.seed,
        precision=args.precision,
        **instruments(args),  # --profile, --log-to
    ) as ctx:
        # --data PATHS tokenized once and packed, else the standard library's bytes; checked
        # the same on every rank and large enough
        data = lm_options.data(ctx, args)
        train_set, val_set = data.train, data.val
        with ctx.init_module():  # on the meta device: setup() allocates what this rank holds
            shape = lm_options.model_shape(args)  # --n-layer, --n-embd, ...
            model = build_model(vocab_size=data.vocab_size, **shape)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95))
        n_params = sum(p.numel() for p in model.parameters())  # whole: a pipeline splits it
        model, optimizer = ctx.setup(model, optimizer)  # wraps (DDP, FSDP), re-points optimizer
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lm_options.warmup_cosine(args))
        loader = ctx.loader(  # a sample is block_size tokens: ctx.throughput() gives tokens/s
            train_set,
            batch_size=args.batch_size,
            accumulation_steps=args.accumulation_steps,
            tokens_per_sample=args.block_size,
        )
        tracked = {"model": model, "optimizer": optimizer, "schedule": schedule, "loader": loader}
        # without --checkpoint-every (only --checkpoint-dir): every 100 steps, and at the end
        every = min(lm_options.CHECKPOINT_EVERY, args.steps)
        ckpt, resumed = job_cli.checkpointer(ctx, args, every=every, **tracked)
        step = resumed or 0
        run = RunLog(ctx, args, data, start_step=step)
        ctx.print(run.header(n_params, loader.batch_size))
        tokens = args.batch_size * args.block_size  # per optimizer step, over every rank
        steps_log = TrackedSteps(ctx, samples_per_step=args.batch_size, tokens_per_step=tokens)
        batches = itertools.chain.from_iterable(itertools.repeat(loader))  # epoch after epoch
        # The schedule steps once per optimizer step: its count is the loop's bound, restored by
        # a resume and healed under replica groups (a local counter would restart at 0 there).
        while schedule.last_epoch < args.steps:
            x, y = next(batches)  # this rank's micro-batch: (sequences, the tokens that follow)
            with ctx.accumulate(model):  # gradients synchronized on the last micro-batch only
                # forward + backward; a pipeline runs its schedule and gives the loss everywhere
                if data.masked:  # --data: the mean over the step's real (unmasked) targets
                    n = (y != IGNORE_INDEX).sum()
                    loss = ctx.forward_backward(
                        model, x, target=y, loss_fn=next_token_loss_sum, num_items=n
                    )
                else:  # every target counts: the mean of each micro-batch's mean
                    loss = ctx.forward_backward(model, x, target=y, loss_fn=next_byte_loss)
                ctx.clip_grad_norm(model, optimizer, 1.0)
                stepped = ctx.step(optimizer)
            run.add(loss.detach())
            steps_log.micro_batch(loss)
            if not stepped:
                continue
            steps_log.stepped(schedule.last_epoch + 1, optimizer.param_groups[0]["lr"])  # its lr
            schedule.step()
            step = schedule.last_epoch
            if ckpt is not None:
                ckpt.step()  # saves every --checkpoint-every steps
            if step % args.eval_every == 0 or step == args.steps:
                run.pause()  # evaluation is not training time
                run.evaluated(step, evaluate(ctx, model, val_set, args.batch_size))
                steps_log.evaluated(step, run.history[-1])
        if not run.history:  # resumed at the last step: nothing left to train, still evaluate
            run.evaluated(step, evaluate(ctx, model, val_set, args.batch_size))
        if ckpt is not None:
            if step > (resumed or 0):
                ckpt.save()  # the last step, unless step() just saved it (then a no-op)
            ckpt.close()
        if isinstance(ctx.strategy, multigpu.PipelineStrategy):
            ctx.print(bubble_line(ctx.strategy, ctx.strategy.bubble(model)))  # collective
        state = ctx.full_state_dict(model)  # gathered from the shards under FSDP (collective)
        # rank 0: model.pt, metrics.json, loss.png; then the lines that name them
        plot = outputs.plot_lm(run.history, run.baseline)
        written = outputs.finish(ctx, state, run.metrics(), args, checkpointer=ckpt, plot=plot)
        ctx.print(run.summary())
        for line in written:
            ctx.print(line)
    return run.metrics()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m multigpu.examples.lm``: exit 0, or 2 on a usage error."""
    return job_cli.run_job(lm_options.build_parser(), train, argv)


if __name__ == "__main__":
    sys.exit(main())

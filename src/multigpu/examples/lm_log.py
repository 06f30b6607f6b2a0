"""The LM job's bookkeeping: training losses, the training clock, one record per evaluation.

Kept out of ``lm.py`` so that the example file shows the model and the training loop only. Every
rank keeps one (its losses are all-reduced at each evaluation); rank 0 prints and writes.

Environment variables read: ``TORCHELASTIC_RESTART_COUNT`` (recorded in metrics.json).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch

from multigpu.examples.lm_data import LMData
from multigpu.examples.progress import throughput_record, throughput_text
from multigpu.session.context import Context


class RunLog:
    """What the LM job reports: a header, a line per evaluation, a summary and metrics.json.

    ``data.baseline`` is the unigram baseline (nats per token), printed beside every validation
    loss; ``start_step`` is above 0 when the run resumed.
    """

    def __init__(
        self, ctx: Context, args: argparse.Namespace, data: LMData, *, start_step: int
    ) -> None:
        self.ctx, self.args, self.data, self.baseline = ctx, args, data, data.baseline
        self.start_step = self.last_step = start_step
        self.history: list[dict[str, Any]] = []
        self.train_seconds = 0.0
        self.n_params = 0
        self._losses: list[torch.Tensor] = []
        self._started = self._clock = time.perf_counter()
        self._elapsed: float | None = None

    @property
    def tokens_per_step(self) -> int:
        """Tokens of one optimizer step over all ranks (masked targets included)."""
        return int(self.args.batch_size * self.args.block_size)

    def header(self, n_params: int, per_rank_batch: int) -> str:
        """Two lines saying what is trained on what, and the baseline to beat; ``n_params``:
        the whole model's (counted before a strategy shards or splits it)."""
        a, ctx, data = self.args, self.ctx, self.data
        self.n_params = n_params
        unit = data.unit
        return (
            f"lm: {self.n_params / 1e6:.2f}M parameters ({a.n_layer} layers x {a.n_head} heads x "
            f"{a.n_embd} wide, context {a.block_size} {unit}); corpus {data.described}, "
            f"unigram baseline {self.baseline:.4f} nats/{unit[:-1]}\n"
            f"lm: {ctx.world_size} process(es) on {ctx.device.type}, strategy "
            f"{ctx.strategy.name}, {a.steps} steps of {a.batch_size} x {a.block_size} {unit} "
            f"({per_rank_batch} sequences per rank x {a.accumulation_steps} micro-step(s)), "
            f"precision {ctx.precision.name}"
        )

    def add(self, loss: torch.Tensor) -> None:
        """Count one micro-batch's (detached) training loss."""
        self._losses.append(loss)

    def pause(self) -> None:
        """Stop the training clock (before an evaluation, which is not training time)."""
        self._elapsed = time.perf_counter() - self._clock

    def evaluated(self, step: int, val_loss: float) -> None:
        """Record (and on rank 0 print) an evaluation at ``step``; restart the training clock."""
        elapsed = self._elapsed if self._elapsed is not None else time.perf_counter() - self._clock
        steps = step - self.last_step
        train_loss = None
        if self._losses:  # the mean over this evaluation's micro-batches, then over ranks
            train_loss = round(float(self.ctx.all_reduce(torch.stack(self._losses).mean())), 4)
        record = {
            "step": step,
            "train_loss": train_loss,
            "val_loss": round(val_loss, 4),
            **throughput_record(self.ctx.throughput(across_ranks=True)),  # since the last one
        }
        if record["tokens_per_second"] is None:  # no step since (resumed at the last step)
            record["tokens_per_second"] = round(steps * self.tokens_per_step / max(elapsed, 1e-9))
        self.history.append(record)
        if self.args.progress == "lines":
            shown = f"{train_loss:.4f}" if train_loss is not None else "-"
            self.ctx.print(
                f"step {step:>5}/{self.args.steps}  train loss {shown}  val loss "
                f"{val_loss:.4f}  (unigram {self.baseline:.4f})  {throughput_text(record)}"
            )
        self.train_seconds += elapsed
        self.last_step, self._losses, self._elapsed = step, [], None
        self._clock = time.perf_counter()

    def metrics(self) -> dict[str, Any]:
        """Everything metrics.json holds (plain values)."""
        a, ctx, last = self.args, self.ctx, self.history[-1]
        trained = self.last_step - self.start_step
        return {
            "val_loss": last["val_loss"],
            "unigram_baseline": round(self.baseline, 4),
            "train_loss": last["train_loss"],
            "tokens_per_second": round(trained * self.tokens_per_step / self.train_seconds)
            if self.train_seconds > 0
            else None,
            "train_seconds": round(self.train_seconds, 3),
            "seconds": round(time.perf_counter() - self._started, 3),
            "steps": a.steps,
            "resumed_from_step": self.start_step or None,
            "world_size": ctx.world_size,
            "device": ctx.device.type,
            "strategy": ctx.strategy.name,
            "precision": ctx.precision.name,
            "n_params": self.n_params,
            # the last progress line's window (history: every line's)
            **{k: last.get(k) for k in ("step_seconds", "collective_wait_share")},
            **{k: last.get(k) for k in ("collective_wait_share_max", "peak_memory_bytes", "mfu")},
            **{k: getattr(a, k) for k in ("batch_size", "block_size", "n_layer", "n_head")},
            **{k: getattr(a, k) for k in ("n_embd", "lr", "seed", "accumulation_steps")},
            "corpus": self.data.record,
            "restarts": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0),
            "history": self.history,
        }

    def summary(self) -> str:
        """The one line that ends the run."""
        m = self.metrics()
        ratio = m["val_loss"] / m["unigram_baseline"]
        return (
            f"val loss {m['val_loss']:.4f} nats/{self.data.unit[:-1]} vs unigram baseline "
            f"{m['unigram_baseline']:.4f} ({ratio:.2f}x) after {self.last_step} steps on "
            f"{m['world_size']} process(es) in {m['seconds']:.1f} s "
            f"({m['tokens_per_second'] or 0} tokens/s)"
        )

"""The built-in job behind ``multigpu train``: a small CNN on scikit-learn's handwritten digits.

Real data that ships with scikit-learn (1,797 8×8 images, no download), split once into a
fixed train/test set (80/20, stratified, independent of the training seed). Run it through the
launcher (``multigpu train --cpu 2``) or directly (``python -m multigpu.examples.digits``).
Kept plain on purpose: it is also the reference for what a multigpu training script looks like.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import multigpu
from multigpu.checkpoint import atomic_write
from multigpu.context import Context
from multigpu.precision import PRECISIONS
from multigpu.strategies import STRATEGY_NAMES


class DigitsCNN(nn.Module):
    """Two 3×3 convolutions, a 2×2 max-pool and two linear layers (~38k parameters)."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def load_digits_split() -> tuple[TensorDataset, TensorDataset]:
    """The digits as (train, test) tensor datasets, pixels scaled to [0, 1]."""
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as e:
        raise multigpu.UsageError(
            "the digits job needs scikit-learn, which is not installed; "
            "run: pip install 'multigpu[examples]'"
        ) from e
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    idx_train, idx_test = train_test_split(
        list(range(len(y))), test_size=0.2, random_state=0, stratify=digits.target
    )
    return TensorDataset(x[idx_train], y[idx_train]), TensorDataset(x[idx_test], y[idx_test])


def evaluate(ctx: Context, model: nn.Module, dataset: TensorDataset, batch_size: int) -> float:
    """Accuracy over ``dataset``, each sample counted exactly once whatever the world size."""
    batch_size = max(1, batch_size // ctx.world_size) * ctx.world_size  # any world size divides
    accuracy = multigpu.Accuracy()  # local counts; one all-reduce in compute(): uneven shards ok
    model.eval()
    with torch.no_grad():
        for x, y in ctx.loader(dataset, batch_size=batch_size, shuffle=False):
            accuracy.update(model(x), y)
    model.train()
    value = float(accuracy.compute())
    if accuracy.count != len(dataset):
        raise RuntimeError(f"evaluation saw {accuracy.count} samples, expected {len(dataset)}")
    return value


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Train and evaluate; return the metrics (written to ``--out`` by rank 0)."""
    started = time.perf_counter()
    with multigpu.init(strategy=args.strategy, seed=args.seed, precision=args.precision) as ctx:
        train_set, test_set = load_digits_split()
        model = DigitsCNN()
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
        model, optimizer = ctx.setup(model, optimizer)
        loader = ctx.loader(
            train_set, batch_size=args.batch_size, accumulation_steps=args.accumulation_steps
        )
        ctx.print(
            f"digits: {len(train_set)} train / {len(test_set)} test samples, {ctx.world_size} "
            f"process(es) on {ctx.device.type}, strategy {ctx.strategy.name}, global batch "
            f"{args.batch_size} ({loader.batch_size} per rank x {args.accumulation_steps} "
            f"micro-step(s)), precision {ctx.precision.name}"
        )
        history, train_seconds, train_samples = [], 0.0, 0
        progress = _progress(ctx, args.progress)
        task = progress.add_task("train", total=args.epochs * len(loader)) if progress else None
        for epoch in range(args.epochs):
            t0 = time.perf_counter()
            loss_sum = torch.zeros((), dtype=torch.float64)
            steps = micro = 0
            for x, y in loader:
                with ctx.accumulate(model):  # all-reduce once per step, on its last micro-batch
                    loss = F.cross_entropy(model(x), y)
                    ctx.backward(loss)
                    stepped = ctx.step(optimizer)  # steps and zeroes the gradients
                loss_sum += loss.detach().double().cpu()
                micro += 1
                steps += stepped
                if progress is not None and task is not None:
                    progress.update(task, advance=1)
            seconds = time.perf_counter() - t0
            train_seconds += seconds
            train_samples += steps * args.batch_size
            mean_loss = float(ctx.all_reduce(loss_sum / max(micro, 1), op="mean"))
            accuracy = evaluate(ctx, model, test_set, args.eval_batch_size)
            record = {
                "epoch": epoch + 1,
                "loss": round(mean_loss, 6),
                "test_accuracy": round(accuracy, 6),
                "samples_per_second": round(steps * args.batch_size / seconds, 1),
            }
            history.append(record)
            if progress is not None:
                progress.console.print(_epoch_line(record, args.epochs))
            elif args.progress != "off":
                ctx.print(_epoch_line(record, args.epochs))
        if progress is not None:
            progress.stop()
        metrics = {
            "test_accuracy": history[-1]["test_accuracy"],
            "world_size": ctx.world_size,
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "lr": args.lr,
            "seed": args.seed,
            "strategy": ctx.strategy.name,
            "precision": ctx.precision.name,
            "accumulation_steps": args.accumulation_steps,
            "device": ctx.device.type,
            "samples_per_second": round(train_samples / train_seconds, 1),
            "seconds": round(time.perf_counter() - started, 3),
            "final_loss": history[-1]["loss"],
            "history": history,
        }
        if ctx.is_main:
            _write_outputs(ctx, model, metrics, args)
        ctx.print(
            f"test accuracy {metrics['test_accuracy']:.4f} on {ctx.world_size} process(es) in "
            f"{metrics['seconds']:.1f} s ({metrics['samples_per_second']:.0f} samples/s)"
        )
    return metrics


def _epoch_line(record: dict[str, Any], epochs: int) -> str:
    return (
        f"epoch {record['epoch']:>3}/{epochs}  loss {record['loss']:.4f}  "
        f"test acc {record['test_accuracy']:.4f}  {record['samples_per_second']:.0f} samples/s"
    )


def _progress(ctx: Context, mode: str) -> Any:
    if not ctx.is_main or mode != "bar" or not sys.stdout.isatty():
        return None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    progress = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        transient=True,
    )
    progress.start()
    return progress


def _write_outputs(ctx: Context, model: nn.Module, metrics: dict[str, Any], args: Any) -> None:
    out = Path(args.out) if args.out else None
    save = Path(args.save) if args.save else (out / "model.pt" if out else None)
    if save is not None:
        state = {k: v.detach().cpu() for k, v in ctx.unwrap(model).state_dict().items()}
        atomic_write(save, lambda fh: torch.save(state, fh))
        metrics["model_path"] = str(save)
        ctx.print(f"saved the model's state dict (unwrapped, CPU tensors) to {save}")
    if out is not None:
        text = json.dumps(metrics, indent=2) + "\n"
        atomic_write(out / "metrics.json", lambda fh: fh.write(text.encode()))


def build_parser() -> argparse.ArgumentParser:
    """The training options of the digits job."""
    p = argparse.ArgumentParser(
        prog="multigpu train",
        description="Train a small CNN on scikit-learn's handwritten digits on all local devices.",
    )
    p.add_argument("--epochs", type=_positive(int), default=12, help="passes over the data (12)")
    p.add_argument(
        "--batch-size",
        type=_positive(int),
        default=64,
        help="GLOBAL batch per optimizer step, split over the processes (64)",
    )
    p.add_argument("--eval-batch-size", type=_positive(int), default=256, help="global eval batch")
    p.add_argument("--lr", type=_positive(float), default=3e-3, help="Adam learning rate (3e-3)")
    p.add_argument("--seed", type=int, default=0, help="seed for every RNG (0)")
    p.add_argument(
        "--accumulation-steps",
        type=_positive(int),
        default=1,
        help="micro-batches per optimizer step (the global batch stays --batch-size)",
    )
    p.add_argument("--precision", choices=PRECISIONS, default="32", help="32, bf16-mixed, 16-mixed")
    p.add_argument(
        "--strategy",
        choices=STRATEGY_NAMES,
        default="auto",
        help="auto (ddp above one process), single, dp (legacy), ddp",
    )
    p.add_argument("--out", help="directory for metrics.json and model.pt")
    p.add_argument("--save", help="path of the model's state dict (default OUT/model.pt)")
    p.add_argument(
        "--progress",
        choices=("bar", "lines", "off"),
        default="bar",
        help="rank-0 progress bar on a terminal, else one line per epoch",
    )
    return p


def _positive(kind: type[int] | type[float]) -> Any:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{value} must be positive")
        return value

    return parse


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m multigpu.examples.digits``."""
    args = build_parser().parse_args(argv)
    try:
        train(args)
    except multigpu.UsageError as e:
        if os.environ.get("RANK", "0") == "0":  # the same message on every rank: say it once
            print(f"multigpu train: error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

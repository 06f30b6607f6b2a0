"""The built-in job behind ``multigpu train``: a small CNN on scikit-learn's handwritten digits.

Real data that ships with scikit-learn (1,797 8×8 images, no download), split once into a
fixed train/test set (80/20, stratified, independent of the training seed). Run it through the
launcher (``multigpu train --cpu 2``) or directly (``python -m multigpu.examples.digits``).
Kept plain on purpose: it is also the reference for what a multigpu training script looks like.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import multigpu
from multigpu.examples import job_cli, outputs
from multigpu.examples.digits_data import load_digits_split
from multigpu.examples.digits_parser import (
    NO_DDP,
    PIPELINE_MICROBATCHES,
    build_parser,
    check_compression,
    check_pipeline,
    pipeline_split_points,
)
from multigpu.examples.job_tracking import TrackedSteps, instruments
from multigpu.examples.progress import throughput_record, throughput_text
from multigpu.examples.run_state import RunState, parameter_sha256
from multigpu.instruments.hang.install import active_log
from multigpu.instruments.hang.stragglers import slowest
from multigpu.session.context import Context
from multigpu.strategies import DDPStrategy


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
    strategy = _strategy(args)
    with multigpu.init(
        strategy=strategy,
        seed=args.seed,
        precision=args.precision,
        **instruments(args),  # --profile, --log-to
    ) as ctx:
        train_set, test_set = load_digits_split()
        model = DigitsCNN()
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
        model, optimizer = ctx.setup(model, optimizer)
        # One process sends nothing: nothing is compressed whatever was asked.
        compression = (
            ctx.strategy.describe().get("compression", "none") if ctx.is_distributed else "none"
        )
        loader = ctx.loader(
            train_set, batch_size=args.batch_size, accumulation_steps=args.accumulation_steps
        )
        ctx.print(
            f"digits: {len(train_set)} train / {len(test_set)} test samples, {ctx.world_size} "
            f"process(es) on {ctx.device.type}, strategy {ctx.strategy.name}, global batch "
            f"{args.batch_size} ({loader.batch_size} per rank x {args.accumulation_steps} "
            f"micro-step(s)), precision {ctx.precision.name}, gradient compression {compression}"
        )
        run = RunState()
        checkpointer, resumed = job_cli.checkpointer(
            ctx,
            args,
            every=max(1, len(loader) // args.accumulation_steps),  # default: once an epoch
            per_rank={"run": run},  # each rank's own loss sums of the epoch in progress
            note=lambda: f" ({len(run.history)} of {args.epochs} epochs recorded)",
            model=model,
            optimizer=optimizer,
            loader=loader,
        )
        if resumed is not None and compression == "powersgd":
            ctx.print(
                "note: PowerSGD's error feedback and warm start are not in checkpoints; they "
                "start afresh here, so this run ends close to, not equal to, an uninterrupted one"
            )
        step_seconds: list[float] = []  # per optimizer step (all its micro-batches), this run
        tracked = TrackedSteps(ctx, samples_per_step=args.batch_size)  # --log-to's records
        in_step = 0.0
        progress = _progress(ctx, args.progress)
        task = progress.add_task("train", total=args.epochs * len(loader)) if progress else None
        while len(run.history) < args.epochs:
            # The loader's epoch is ahead of the history only when a checkpoint was taken at
            # an epoch's last step and the run stopped before that epoch was evaluated.
            if loader.epoch == len(run.history):
                tick = time.perf_counter()
                handed_out = 0
                for x, y in loader:
                    handed_out += 1
                    with ctx.accumulate(model):  # all-reduce once per step, on its last micro
                        # forward + backward (a pipeline runs its schedule; loss on every rank)
                        loss = ctx.forward_backward(model, x, target=y, loss_fn=F.cross_entropy)
                        stepped = ctx.step(optimizer)  # steps and zeroes the gradients
                    now = time.perf_counter()
                    in_step += now - tick
                    if stepped:
                        step_seconds.append(in_step)
                        in_step = 0.0
                    run.add_step(
                        float(loss.detach()),
                        stepped=stepped,
                        seconds=now - tick,
                        samples=args.batch_size,
                    )
                    tracked.micro_batch(loss)
                    if stepped:
                        tracked.stepped(run.steps, optimizer.param_groups[0]["lr"])
                    tick = time.perf_counter()  # the log call is not the next step's time
                    # saves every --checkpoint-every steps; a save is not training time
                    if stepped and checkpointer is not None and checkpointer.step():
                        tick = time.perf_counter()
                    if progress is not None and task is not None:
                        progress.update(task, advance=1)
                if not handed_out:  # replica groups: the job ended (another group finished it)
                    break
            record = _finish_epoch(ctx, model, test_set, args, run)
            tracked.evaluated(run.train_steps, _epoch_values(record))
            if progress is not None:
                progress.console.print(_epoch_line(record, args.epochs))
            elif args.progress != "off":
                ctx.print(_epoch_line(record, args.epochs))
        if progress is not None:
            progress.stop()
        if checkpointer is not None:
            checkpointer.close()
        history = run.history
        whole = ctx.full_state_dict(model)  # every rank: under FSDP it gathers the shards
        metrics = {
            "test_accuracy": history[-1]["test_accuracy"],
            "world_size": ctx.world_size,
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "lr": args.lr,
            "seed": args.seed,
            "strategy": ctx.strategy.name,
            "precision": ctx.precision.name,
            "compression": compression,
            "accumulation_steps": args.accumulation_steps,
            "device": ctx.device.type,
            "samples_per_second": round(run.train_samples / max(run.train_seconds, 1e-9), 1),
            "step_ms_median": round(1e3 * statistics.median(step_seconds), 3)
            if step_seconds
            else None,
            "seconds": round(time.perf_counter() - started, 3),
            "final_loss": history[-1]["loss"],
            "param_sha256": parameter_sha256(whole),
            "restarts": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0),
            "resumed_from_step": resumed,
            "history": history,
        }
        # rank 0: model.pt (unwrapped, CPU tensors), metrics.json, loss.png; the lines naming them
        written = outputs.finish(
            ctx, whole, metrics, args, checkpointer=checkpointer, plot=outputs.plot_digits(history)
        )
        ctx.print(
            f"test accuracy {metrics['test_accuracy']:.4f} on {ctx.world_size} process(es) in "
            f"{metrics['seconds']:.1f} s ({metrics['samples_per_second']:.0f} samples/s)"
        )
        for line in written:
            ctx.print(line)
    return metrics


def _epoch_values(record: dict[str, Any]) -> dict[str, Any]:
    """What an epoch's record sends to the trackers, at the step the epoch ended."""
    return {
        "epoch": record["epoch"],
        "epoch_loss": record["loss"],  # the mean over every rank's micro-batches
        "test_accuracy": record["test_accuracy"],
        "epoch_samples_per_s": record["samples_per_second"],
    }


def _strategy(args: argparse.Namespace) -> str | DDPStrategy | multigpu.PipelineStrategy | None:
    """``--strategy``, as a ``DDPStrategy`` carrying ``--compression`` when that is given
    (and the strategy, given or ``MULTIGPU_STRATEGY``, has DDP's all-reduce), or the pipeline."""
    name = check_compression(args.strategy, args.compression)
    if name == "pipeline":
        return _pipeline(args)
    if args.compression is None or name in NO_DDP:
        return args.strategy
    return DDPStrategy(compression=args.compression)


def _pipeline(args: argparse.Namespace) -> multigpu.PipelineStrategy:
    """One stage per process (``digits_parser.pipeline_split_points``), traced with one batch of
    images; the batch is cut into up to 4 micro-batches."""
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    check_pipeline(args, processes, "pipeline")
    return multigpu.PipelineStrategy(
        example_input=torch.zeros(args.batch_size, 1, 8, 8),
        split_points=pipeline_split_points(processes),
        schedule="1f1b",
        microbatches=math.gcd(args.batch_size, PIPELINE_MICROBATCHES),
    )


def _finish_epoch(
    ctx: Context, model: nn.Module, test_set: TensorDataset, args: Any, run: RunState
) -> dict[str, Any]:
    """Evaluate, and append the record of the epoch whose batches are done."""
    done = run.close_epoch()
    # this epoch's steps: step time, collective-wait share, peak memory (read before evaluating)
    figures = throughput_record(ctx.throughput(across_ranks=True))
    figures.pop("tokens_per_second")
    figures.pop("mfu")  # no tokens: the CNN has no FLOPs-per-token figure
    loss_sum = torch.tensor(done["loss_sum"] / max(done["micro"], 1), dtype=torch.float64)
    record = {
        "epoch": len(run.history) + 1,
        "loss": round(float(ctx.all_reduce(loss_sum, op="mean")), 6),
        "test_accuracy": round(evaluate(ctx, model, test_set, args.eval_batch_size), 6),
        "samples_per_second": round(done["samples"] / max(done["seconds"], 1e-9), 1),
        **figures,
    }
    recorder = active_log()
    if recorder is not None and ctx.is_distributed:  # step time outside collectives, per rank
        found = slowest(ctx.gather((recorder.busy_s, recorder.steps)))
        if found is not None:
            record["slowest_rank"], record["slowest_ratio"], record["straggler"] = found
    run.history.append(record)
    return record


def _epoch_line(record: dict[str, Any], epochs: int) -> str:
    ratio = record.get("slowest_ratio", 0.0)
    straggler = (
        f"  straggler: rank {record['slowest_rank']} {ratio:.2f}x the median step time"
        if record.get("straggler")
        else ""
    )
    return (
        f"epoch {record['epoch']:>3}/{epochs}  loss {record['loss']:.4f}  "
        f"test acc {record['test_accuracy']:.4f}  {record['samples_per_second']:.0f} samples/s  "
        f"{throughput_text(record)}{straggler}"
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


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m multigpu.examples.digits``."""
    return job_cli.run_job(build_parser(), train, argv)


if __name__ == "__main__":
    sys.exit(main())

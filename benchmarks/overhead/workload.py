"""What the four overhead jobs share: settings, model, data, the step clock and the result file.

Every job (``ddp_raw.py``, ``multigpu_job.py``, ``accelerate_job.py``, ``fabric_job.py``) trains
the same model on the same data with the same global batch and seed; only the framework differs.

The data set is shuffled once here, with a fixed seed, and every job reads it in order
(``shuffle=False``, ``drop_last=True``, a size that is a whole number of global batches). The
frameworks' own shuffles differ (DistributedSampler, also under Fabric: ``randperm`` seeded
``seed + epoch``; multigpu: a permutation seeded from ``(seed, epoch)``), but read in order every
one of them puts samples ``[s*B, (s+1)*B)`` into global step ``s``: the same global batches, so
the same averaged gradients and the same losses up to float rounding. How a global batch is split
between the ranks differs: DistributedSampler deals samples round-robin (rank r: r, r+2, ...);
multigpu and Accelerate give each rank a contiguous slice. So ddp and fabric agree bitwise, as do
multigpu and accelerate; between the two pairs the partial sums round differently (a few 1e-7 of
the loss at first, growing slowly with the steps).

Environment variables read:
    BENCH_MODEL   ``mlp`` (1024-1024-1024-1024-10, 3.16M parameters) or ``cnn`` (the digits CNN
                  of ``multigpu train``, 38k parameters, 8x8 inputs); default ``mlp``.
    BENCH_STEPS   optimizer steps to run (default 200).
    BENCH_WARMUP  first steps left out of the timing (default 20).
    BENCH_BATCH   GLOBAL batch per optimizer step (default 64).
    BENCH_SEED    seed of the weights and the data (default 0).
    BENCH_WORLD_SIZE  processes the job must run on (default 2): a job that finds another world
                  size, no process group, or no DistributedDataParallel around the model stops
                  with an error instead of timing something else.
    BENCH_OUT     where rank 0 writes its result as JSON (default: nowhere).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

STEPS_PER_EPOCH = 25
"""Global batches in the data set: a run of 200 steps crosses 8 epochs, as real training does."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    """One job's settings, read from the environment by ``settings()``."""

    model: str
    """``mlp`` or ``cnn``."""
    steps: int
    """Optimizer steps to run."""
    warmup: int
    """First steps left out of the timing."""
    batch: int
    """Global batch per optimizer step."""
    seed: int
    """Seed of the weights and the data."""
    world_size: int
    """Processes the job must run on (checked by ``require_data_parallel``)."""
    out: str
    """Where rank 0 writes the result (empty: nowhere)."""


def settings() -> Settings:
    """The job's settings from ``BENCH_*`` (see the module docstring).

    Example:
        >>> settings().model in ("mlp", "cnn")
        True
    """
    env = os.environ
    model = env.get("BENCH_MODEL", "mlp")
    if model not in ("mlp", "cnn"):
        raise SystemExit(f"BENCH_MODEL={model!r}; expected mlp or cnn")
    return Settings(
        model=model,
        steps=int(env.get("BENCH_STEPS", "200")),
        warmup=int(env.get("BENCH_WARMUP", "20")),
        batch=int(env.get("BENCH_BATCH", "64")),
        seed=int(env.get("BENCH_SEED", "0")),
        world_size=int(env.get("BENCH_WORLD_SIZE", "2")),
        out=env.get("BENCH_OUT", ""),
    )


class DigitsCNN(nn.Module):
    """The CNN of ``multigpu train`` (two 3x3 convolutions, a max-pool, two linear layers)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        out: torch.Tensor = self.fc2(F.relu(self.fc1(x.flatten(1))))
        return out


def build_model(cfg: Settings) -> nn.Module:
    """The model, initialised from ``cfg.seed`` alone (the same weights in every job and rank)."""
    torch.manual_seed(cfg.seed)
    if cfg.model == "cnn":
        return DigitsCNN()
    width = 1024
    return nn.Sequential(
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, 10),
    )


def build_dataset(cfg: Settings) -> TensorDataset:
    """Synthetic inputs, ``STEPS_PER_EPOCH`` global batches in a fixed shuffled order, labelled
    by a random linear teacher (a learnable task rather than noise; in 200 steps of this SGD the
    loss moves little from ln 10, which is fine: the check is that the four agree)."""
    generator = torch.Generator().manual_seed(cfg.seed + 1)
    count = STEPS_PER_EPOCH * cfg.batch
    shape = (count, 1, 8, 8) if cfg.model == "cnn" else (count, 1024)
    x = torch.rand(shape, generator=generator) - 0.5
    teacher = torch.randn(x[0].numel(), 10, generator=generator)
    y = (x.flatten(1) @ teacher).argmax(dim=1)
    return TensorDataset(x, y)


def require_data_parallel(cfg: Settings, model: nn.Module, framework: str) -> None:
    """Stop unless this process trains in a gloo group of ``cfg.world_size`` under DDP.

    A framework that quietly runs each process alone (Accelerate on a machine without a GPU and
    without ``cpu=True``) would otherwise be timed on an all-reduce-free step, and look fast.
    Call it after the framework's set-up, on every rank.
    """
    grouped = dist.is_available() and dist.is_initialized()
    found = dist.get_world_size() if grouped else 1
    backend = str(dist.get_backend()) if grouped else "none"
    ddp = any(isinstance(m, nn.parallel.DistributedDataParallel) for m in model.modules())
    if found != cfg.world_size or backend != "gloo" or not ddp:
        raise SystemExit(
            f"{framework}: world size {found}, backend {backend}, DistributedDataParallel "
            f"{'found' if ddp else 'NOT found'} around the model; expected world size "
            f"{cfg.world_size} on gloo under DDP: not data-parallel, nothing comparable to time"
        )


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    """Plain SGD: rounding differences between the jobs stay at float32 level (no Adam blow-up)."""
    return torch.optim.SGD(model.parameters(), lr=0.05)


@dataclass
class StepClock:
    """Per-step wall times on this rank: call ``tick()`` right after each ``optimizer.step()``.

    A step's time runs from the end of the previous step to the end of this one, so it holds the
    loader's work (fetching, collating, moving the batch) as well as forward, backward, the
    gradient all-reduce and the update. ``cpu_times`` are the same intervals in CPU time of the
    whole process (every thread: gloo's, the framework's own), which other programs on the machine
    disturb much less than wall time. ``first_step_wall`` is ``time.time()`` when the first
    step ended, to compare with the launching command's start.
    """

    warmup: int
    times: list[float] = field(default_factory=list)
    rows: set[int] = field(default_factory=set)
    """Samples per batch seen on this rank (one value: the per-rank batch)."""
    cpu_times: list[float] = field(default_factory=list)
    first_step_wall: float = 0.0
    loop_start_wall: float = 0.0
    steps: int = 0
    _last: float = field(default_factory=time.perf_counter)
    _last_cpu: float = field(default_factory=time.process_time)

    def start(self) -> None:
        """Mark the start of the first step (after setup, before the loader is first iterated)."""
        self._last = time.perf_counter()
        self._last_cpu = time.process_time()
        self.loop_start_wall = time.time()

    def tick(self, rows: int) -> None:
        """Record the step that just ended, whose batch on this rank held ``rows`` samples."""
        now, cpu = time.perf_counter(), time.process_time()
        self.rows.add(rows)
        if self.steps == 0:
            self.first_step_wall = time.time()
        if self.steps >= self.warmup:
            self.times.append(now - self._last)
            self.cpu_times.append(cpu - self._last_cpu)
        self._last, self._last_cpu = now, cpu
        self.steps += 1


def process_start_wall() -> float:
    """When this process started (``time.time()`` scale, 10 ms steps); 0.0 where /proc is not."""
    try:
        with open("/proc/self/stat") as f:
            # Field 22 (after the parenthesised name, which may hold spaces): start in clock ticks.
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:  # btime in /proc/stat is whole seconds only
            boot = time.time() - float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def global_loss(loss: torch.Tensor) -> float:
    """The mean of ``loss`` over ranks (each rank's batch is the same size, so the global mean)."""
    value = loss.detach().to(torch.float64).reshape(1).cpu()
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(value)
        value /= dist.get_world_size()
    return float(value.item())


def write_result(
    cfg: Settings, framework: str, clock: StepClock, loss: torch.Tensor, model: nn.Module
) -> None:
    """Write rank 0's result to ``BENCH_OUT``; every rank must call it (it all-reduces the loss).

    Stops when this rank's batches did not hold ``batch / world size`` samples each (the global
    batch would then differ from the other frameworks').
    """
    final = global_loss(loss)
    distributed = dist.is_available() and dist.is_initialized()
    world = dist.get_world_size() if distributed else 1
    if clock.rows != {cfg.batch // world}:
        raise SystemExit(
            f"{framework}: per-rank batches of {sorted(clock.rows)} samples; expected "
            f"{cfg.batch // world} (global batch {cfg.batch} over {world} processes)"
        )
    rank = dist.get_rank() if distributed else 0
    if rank != 0 or not cfg.out:
        return
    result: dict[str, Any] = {
        "framework": framework,
        "settings": asdict(cfg),
        "step_times": clock.times,
        "cpu_times": clock.cpu_times,
        "first_step_wall": clock.first_step_wall,
        "loop_start_wall": clock.loop_start_wall,
        "process_start_wall": process_start_wall(),
        "steps": clock.steps,
        "final_loss": final,
        "param_sum": float(sum(p.detach().double().sum() for p in model.parameters())),
        "world_size": world,
        "rank_batch": cfg.batch // world,
        "backend": str(dist.get_backend()) if distributed else "none",
        "threads": torch.get_num_threads(),
        "wrapper": type(model).__name__,
        "torch": torch.__version__,
    }
    with open(cfg.out, "w") as f:
        json.dump(result, f)

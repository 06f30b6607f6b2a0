"""``multigpu bench scaling``: samples/s, speed-up and efficiency of a script at each world size.

Each configuration is one ``python -m multigpu run --cpu P script ...`` (``--gpus P`` on GPUs)
with ``MULTIGPU_BENCH_DIR`` / ``MULTIGPU_BENCH_STEPS`` set, so that ``multigpu.init()`` records
when each optimizer step ends (``multigpu.instruments.bench_record``) and stops the script after
``--warmup`` + ``--steps`` steps. Throughput = samples per step (the global batch of the
script's ``ctx.loader``) / the median time between two optimizer steps after the warm-up — the
median, so that an evaluation at an epoch's end or a noisy neighbour does not count as training
speed; the mean-based figure is in the JSON too. With several ranks, the slowest rank's median.

On CPUs: the scaling rows run N processes x 1 thread (adding a process adds a core); the split
rows run every P x T with P·T = the usable cores; the fastest split is saved for ``--cpu auto``
(``cache``). Configurations are interleaved across ``--repeats`` and the median taken.

The result is one JSON-ready document (what ``--json`` prints and ``scaling.json`` holds):
``{"kind", "target", "script_args", "device", "cores", "torch", "steps", "warmup", "repeats",
"samples_per_step", "scaling": [row...], "splits": [row...], "recommendation"}``; a row is
``{"processes", "threads", "samples_per_second", "steps_per_second", "step_ms",
"samples_per_second_mean", "runs", "speedup", "efficiency", "error"}``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multigpu.common.host import usable_cores
from multigpu.diagnostics.bench.splits import core_splits, fastest, load_before, split_label
from multigpu.diagnostics.child_run import run_child
from multigpu.diagnostics.options import device_for_runs
from multigpu.launch.cpu_split import SplitRecord, save_record, script_key, torch_version
from multigpu.launch.engine_topology import one_machine_env

log = logging.getLogger(__name__)

BENCH_FILE = "bench-rank{rank}.json"
"""Written by ``multigpu.instruments.bench_record`` (repeated here: diagnostics never imports that
side)."""


@dataclass(frozen=True, kw_only=True)
class ScalingOptions:
    """What ``multigpu bench scaling`` was asked to measure."""

    target: str
    """The script's path, or the module with ``is_module``."""
    is_module: bool
    """``target`` is a module (``-m``)."""
    script_args: tuple[str, ...] = ()
    """Arguments passed to the script unchanged."""
    nproc: tuple[int, ...] = (1, 2)
    """World sizes, ascending; the first is the baseline of the speed-up."""
    steps: int = 50
    """Timed optimizer steps per run."""
    warmup: int = 5
    """Optimizer steps before them, not timed (start-up, first allocations)."""
    repeats: int = 1
    """Runs per configuration, interleaved; the median is reported."""
    as_json: bool = False
    """Print one JSON document instead of the tables."""
    out: Path | None = None
    """Directory for scaling.json, scaling.csv and scaling.png (None: write nothing)."""
    cpu: bool = False
    """CPU processes even on a machine with GPUs."""
    splits: bool = True
    """On CPUs, also measure every processes x threads split of the cores and save the best."""
    timeout: float = 600.0
    """Seconds one run may take."""


@dataclass(frozen=True, kw_only=True)
class Config:
    """One way to run the script: processes and (on CPU) threads per process."""

    processes: int
    """Worker processes (GPUs on ``cuda``)."""
    threads: int | None
    """OMP threads per process on CPU; None on GPUs."""

    @property
    def label(self) -> str:
        """``"2x1"`` on CPU, ``"2 GPU(s)"`` on GPUs."""
        return split_label(self.processes, self.threads)


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """What one run gave (None throughputs when it failed: see ``error``)."""

    samples_per_second: float | None = None
    """Samples per step / the median step time (None without ``ctx.loader``)."""
    samples_per_second_mean: float | None = None
    """Samples per step / the mean step time over the timed window."""
    steps_per_second: float | None = None
    """1 / the median step time."""
    samples_per_step: int | None = None
    """The global batch of the script's training loader."""
    timed_steps: int = 0
    """Steps timed (after the warm-up)."""
    wall_s: float = 0.0
    """The run's wall time, start-up included."""
    error: str = ""
    """Why the run gave no figure (empty when it did)."""


@dataclass(frozen=True, kw_only=True)
class Row:
    """A configuration's figures over the repeats (medians) and its place in the table."""

    processes: int
    threads: int | None
    samples_per_second: float | None
    steps_per_second: float | None
    step_ms: float | None
    samples_per_second_mean: float | None
    timed_steps: int = 0
    """Steps timed per run (the fewest over the repeats; below --steps: the script ended)."""
    runs: list[float | None] = field(default_factory=list)
    """Each repeat's samples/s (steps/s without a loader), in order."""
    best: float | None = None
    """The highest of ``runs``: other processes only ever slow a run down, so it is the
    closest to an idle machine's figure (the medians are what is reported and compared)."""
    speedup: float | None = None
    efficiency: float | None = None
    error: str = ""
    """Why every run failed (empty when one gave a figure)."""
    failed_runs: list[str] = field(default_factory=list)
    """The errors of the repeats that failed while others gave a figure."""


def step_stats(records: Sequence[Mapping[str, Any]], warmup: int) -> Measurement:
    """Throughput from every rank's record (see the module doc for the definitions)."""
    medians, means = [], []
    timed = 0
    for record in records:
        ends = list(record.get("step_ends", []))
        if len(ends) < warmup + 1:
            return Measurement(
                error=f"the script made only {len(ends)} optimizer step(s); at least "
                f"--warmup + 1 = {warmup + 1} are needed (pass its optimizer to ctx.setup, "
                "and give it enough data)"
            )
        window = ends[warmup - 1 :]
        gaps = [b - a for a, b in itertools.pairwise(window)]
        medians.append(statistics.median(gaps))
        means.append((window[-1] - window[0]) / len(gaps))
        timed = len(gaps)
    median, mean = max(medians), max(means)  # the slowest rank sets the pace
    samples = records[0].get("samples_per_step")
    return Measurement(
        samples_per_second=samples / median if samples else None,
        samples_per_second_mean=samples / mean if samples else None,
        steps_per_second=1 / median,
        samples_per_step=samples,
        timed_steps=timed,
    )


def child_env(
    environ: Mapping[str, str], directory: Path, total_steps: int, threads: int | None
) -> dict[str, str]:
    """One run's environment: the caller's plus the recorder's variables and the threads."""
    env = one_machine_env(environ)  # this machine's runs, also in a pod of a multi-node job
    env.update(MULTIGPU_BENCH_DIR=str(directory), MULTIGPU_BENCH_STEPS=str(total_steps))
    if threads is not None:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        env["GLOO_SOCKET_IFNAME"] = "lo"  # one machine: loopback, whatever the hostname says
    return env


def scaling_argv(options: ScalingOptions, config: Config) -> list[str]:
    """The ``multigpu run`` command line of one configuration."""
    devices = ["--cpu" if config.threads is not None else "--gpus", str(config.processes)]
    target = ["-m", options.target] if options.is_module else [options.target]
    return [sys.executable, "-m", "multigpu", "run", *devices, *target, *options.script_args]


def measure(options: ScalingOptions, config: Config, directory: Path) -> Measurement:
    """Run one configuration once and read its records."""
    directory.mkdir(parents=True, exist_ok=True)
    env = child_env(os.environ, directory, options.warmup + options.steps, config.threads)
    run = run_child(scaling_argv(options, config), env, timeout=options.timeout, logs=directory)
    if run.returncode != 0:
        why = run.reason or "see the launcher's output (run the command with `multigpu run`)"
        return Measurement(wall_s=run.seconds, error=f"exit code {run.returncode}: {why}")
    records = []
    for rank in range(config.processes):
        path = directory / BENCH_FILE.format(rank=rank)
        if path.is_file():
            records.append(json.loads(path.read_text()))
    if len(records) != config.processes:
        return Measurement(
            wall_s=run.seconds,
            error="no step record: the script must call multigpu.init() (records are taken there)",
        )
    return dataclasses.replace(step_stats(records, options.warmup), wall_s=run.seconds)


def configurations(
    options: ScalingOptions, device: str, cores: int
) -> tuple[list[Config], list[Config]]:
    """(the scaling rows' configurations, the split rows'), in the order they run."""
    if device == "cuda":
        return [Config(processes=n, threads=None) for n in options.nproc], []
    scaling = [Config(processes=n, threads=1) for n in options.nproc]
    splits = (
        [Config(processes=p, threads=t) for p, t in core_splits(cores)] if options.splits else []
    )
    return scaling, splits


def _median(values: Sequence[float | None]) -> float | None:
    ok = [v for v in values if v is not None]
    return statistics.median(ok) if ok else None


def summarize(config: Config, runs: Sequence[Measurement]) -> Row:
    """A configuration's row: medians over its repeats (speed-up filled in later)."""
    steps = _median([m.steps_per_second for m in runs])
    figures = [m.samples_per_second or m.steps_per_second for m in runs]
    errors = [m.error for m in runs if m.error]
    return Row(
        processes=config.processes,
        threads=config.threads,
        samples_per_second=_median([m.samples_per_second for m in runs]),
        steps_per_second=steps,
        step_ms=1000 / steps if steps else None,
        samples_per_second_mean=_median([m.samples_per_second_mean for m in runs]),
        timed_steps=min((m.timed_steps for m in runs if not m.error), default=0),
        runs=figures,
        best=max((f for f in figures if f is not None), default=None),
        error=errors[0] if len(errors) == len(runs) else "",
        failed_runs=errors if len(errors) < len(runs) else [],
    )


def throughput(row: Row) -> float | None:
    """samples/s, or steps/s for a script without ``ctx.loader``."""
    return row.samples_per_second if row.samples_per_second is not None else row.steps_per_second


def with_speedups(rows: Sequence[Row], *, efficiency: bool = True) -> list[Row]:
    """Speed-up = throughput / the first row's; with ``efficiency``, also efficiency = speed-up /
    (processes / the first row's processes). Split rows (the same cores, split otherwise) skip it.
    """
    base = throughput(rows[0]) if rows else None
    out = []
    for row in rows:
        value = throughput(row)
        if not base or value is None:
            out.append(row)
            continue
        speedup = value / base
        scaled = speedup / (row.processes / rows[0].processes) if efficiency else None
        out.append(dataclasses.replace(row, speedup=speedup, efficiency=scaled))
    return out


def run_all(
    options: ScalingOptions, configs: Sequence[Config], root: Path
) -> dict[Config, list[Measurement]]:
    """Run every configuration ``--repeats`` times, interleaved (a noisy neighbour spreads out)."""
    results: dict[Config, list[Measurement]] = {c: [] for c in configs}
    for repeat in range(options.repeats):
        for config in configs:
            m = measure(options, config, root / f"{config.label.replace(' ', '')}-{repeat}")
            results[config].append(m)
            figure = (
                f"{m.samples_per_second:.0f} samples/s"
                if m.samples_per_second
                else f"{m.steps_per_second:.2f} steps/s"
                if m.steps_per_second
                else m.error
            )
            log.info(
                "bench scaling: %s, run %d/%d: %s (%.1f s with start-up)",
                config.label,
                repeat + 1,
                options.repeats,
                figure,
                m.wall_s,
            )
    return results


KIND = (
    "strong scaling: the global batch (the script's ctx.loader batch_size) is fixed and "
    "shared by the processes; speed-up = throughput / the smallest world size's; "
    "efficiency = speed-up / (world size / the smallest)"
)


def bench_scaling(options: ScalingOptions, root: Path) -> dict[str, Any]:
    """Measure every configuration, compute the rows, and record the fastest CPU split in the
    ``--cpu auto`` cache. Each run leaves its records and logs under ``root``."""
    device = device_for_runs(options.nproc, cpu=options.cpu)
    cores = usable_cores()
    scaling_configs, split_configs = configurations(options, device, cores)
    if device == "cpu" and max(options.nproc) > cores:
        log.warning(
            "--nproc %s: more processes than the %d usable cores; the extra processes share "
            "cores, so their speed-up says little",
            ",".join(map(str, options.nproc)),
            cores,
        )
    order = list(dict.fromkeys([*scaling_configs, *split_configs]))  # 2x1 may be in both
    load = load_before()  # before our own runs add to it
    results = run_all(options, order, root)
    scaling = with_speedups([summarize(c, results[c]) for c in scaling_configs])
    splits = [summarize(c, results[c]) for c in split_configs]
    per_step = next(
        (m.samples_per_step for ms in results.values() for m in ms if m.samples_per_step), None
    )
    document: dict[str, Any] = {
        "kind": KIND,
        "target": options.target,
        "is_module": options.is_module,
        "script_args": list(options.script_args),
        "device": device,
        "cores": cores,
        "torch": torch_version(),
        "steps": options.steps,
        "warmup": options.warmup,
        "repeats": options.repeats,
        "samples_per_step": per_step,
        "load_before": load,
        "scaling": [dataclasses.asdict(r) for r in scaling],
        "splits": [dataclasses.asdict(r) for r in with_speedups(splits, efficiency=False)],
        "recommendation": None,
    }
    best = fastest({(r.processes, r.threads or 1): throughput(r) for r in splits})
    if best is not None:
        (row,) = [r for r in splits if (r.processes, r.threads) == best]
        value = throughput(row) or 0.0
        record = SplitRecord(
            cores=cores,
            script=script_key(options.target, is_module=options.is_module),
            processes=best[0],
            threads=best[1],
            samples_per_second=value,
            measured={split_label(r.processes, r.threads or 1): throughput(r) for r in splits},
        )
        by_best = fastest({(r.processes, r.threads or 1): r.best for r in splits})
        document["recommendation"] = {
            "processes": best[0],
            "threads": best[1],
            "throughput": value,
            "cache": str(save_record(record)),
            # Another split when noise, not the splits, decided.
            "best_runs_favour": split_label(*by_best) if by_best not in (None, best) else None,
        }
    return document

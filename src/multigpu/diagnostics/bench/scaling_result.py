"""``multigpu bench scaling`` end to end: run the configurations, build the result, save the split.

The result is one JSON-ready document (what ``--json`` prints and ``scaling.json`` holds):
``{"kind", "target", "script_args", "device", "cores", "torch", "steps", "warmup", "repeats",
"samples_per_step", "scaling": [row...], "splits": [row...], "recommendation"}``; a row is
``{"processes", "threads", "samples_per_second", "steps_per_second", "step_ms",
"samples_per_second_mean", "runs", "speedup", "efficiency", "error"}``.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from multigpu.diagnostics.bench.scaling import (
    configurations,
    run_all,
    summarize,
    throughput,
    with_speedups,
)
from multigpu.diagnostics.bench.scaling_options import ScalingOptions
from multigpu.diagnostics.bench.splits import fastest, load_before, split_label
from multigpu.diagnostics.options import device_for_runs
from multigpu.host import usable_cores
from multigpu.launch.cpu_split import new_record, save_record, script_key, torch_version

log = logging.getLogger(__name__)

KIND = (
    "strong scaling: the global batch (the script's ctx.loader batch_size) is fixed and "
    "shared by the processes; speed-up = throughput / the smallest world size's; "
    "efficiency = speed-up / (world size / the smallest)"
)


def bench_scaling(options: ScalingOptions, root: Path, *, save: bool = True) -> dict[str, Any]:
    """Measure every configuration, compute the rows, and (``save``) record the fastest CPU
    split in the ``--cpu auto`` cache. Each run leaves its records and logs under ``root``."""
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
        document["recommendation"] = {
            "processes": best[0],
            "threads": best[1],
            "throughput": value,
            "cache": None,
            "best_runs_favour": None,
        }
        by_best = fastest({(r.processes, r.threads or 1): r.best for r in splits})
        if by_best is not None and by_best != best:  # noise, not the splits, decided
            document["recommendation"]["best_runs_favour"] = split_label(*by_best)
        if save:
            record = new_record(
                cores=cores,
                script=script_key(options.target, is_module=options.is_module),
                best=best,
                sps=value,
                measured={split_label(r.processes, r.threads or 1): throughput(r) for r in splits},
            )
            document["recommendation"]["cache"] = str(save_record(record))
    return document

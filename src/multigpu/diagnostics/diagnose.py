"""Why results differ between world sizes: pure functions of the runs' records.

``find_reasons`` names what breaks world-size invariance when ``multigpu verify`` fails
(Dropout, a per-rank batch size, a world-size dependent dataset, different step counts, no
``ctx.loader``, BatchNorm without synchronisation whose tensors differ, gradient compression,
losses averaged per micro-batch over padded targets, accumulation steps the script ignored...);
``find_notes`` says what could not be checked (no losses, no model, a script that ended early)
and is shown on PASS too. Each is one line: what was seen, why it matters, what to do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from multigpu.diagnostics.compare import RunComparison, Tolerance
from multigpu.diagnostics.records import RunRecord

NOT_DETERMINISTIC = (
    "the script is not deterministic even at one world size: two runs at world size {ws} "
    "differ ({what}); look for an unseeded random generator or nondeterministic ops, "
    "try --deterministic"
)


def _by_world_size(runs: Sequence[RunRecord], value: Callable[[RunRecord], Any]) -> str:
    return ", ".join(f"{value(run)} at {run.label}" for run in runs)


def _differs(runs: Sequence[RunRecord], value: Callable[[RunRecord], Any]) -> bool:
    return len({repr(value(run)) for run in runs}) > 1


def _names(names: Sequence[str]) -> str:
    return ", ".join(f"'{name}'" for name in names)


def _loader_field(name: str) -> Callable[[RunRecord], Any]:
    def get(run: RunRecord) -> Any:
        values = [loader.get(name) for loader in run.loaders]
        return values[0] if len(values) == 1 else values

    return get


def _all_loaders(run: RunRecord) -> list[Any]:
    """Every loader's accumulation steps in ``run``."""
    return [loader.get("accumulation_steps") for loader in run.loaders]


def find_reasons(runs: Sequence[RunRecord], comparisons: Sequence[RunComparison]) -> list[str]:
    """What in the records explains results that differ between world sizes (``runs``: the
    reference first; ``comparisons``: every other run against it).

    Example:
        >>> a = RunRecord(world_size=1, ranks=[{"dropout": ["drop"], "loaders": [{}]}])
        >>> find_reasons([a, a], [])[0].startswith("Dropout modules present ('drop')")
        True
    """
    reasons: list[str] = []
    for run in runs:
        if run.recorded_world_size not in (None, run.world_size):
            reasons.append(
                f"the run started with {run.world_size} processes recorded world size "
                f"{run.recorded_world_size}: the script does not run as one job of "
                "torchrun's processes (does it start its own, or ignore multigpu.init()?)"
            )
    dropout = list(dict.fromkeys(name for run in runs for name in run.dropout))
    if dropout:
        reasons.append(
            f"Dropout modules present ({_names(dropout)}): each rank draws its own dropout "
            "masks, so the masks differ between world sizes; verify with p=0 (or model.eval()) "
            "or accept differences of the size of the dropout noise (--rtol)"
        )
    if any(not run.loaders for run in runs):
        reasons.append(
            "the script does not use ctx.loader: its data order may depend on the world size; "
            "make the loader with ctx.loader(dataset, batch_size=GLOBAL_BATCH)"
        )
    elif _differs(runs, lambda r: len(r.loaders)):
        reasons.append(
            "the number of ctx.loader calls differs between runs "
            f"({_by_world_size(runs, lambda r: len(r.loaders))}): the script builds its data "
            "differently at each world size"
        )
    else:
        reasons.extend(_loader_reasons(runs))
    steps = [c for c in comparisons if c.steps != c.reference_steps]
    if steps:
        reasons.append(
            f"different numbers of optimizer steps ({_by_world_size(runs, lambda r: r.steps)}): "
            "an epoch has a different number of global batches at each world size (a per-rank "
            "batch size, or a dataset split by hand?)"
        )
    if _differs(runs, lambda r: (r.dtype, r.precision)):
        reasons.append(
            "dtype or precision differs between runs "
            f"({_by_world_size(runs, lambda r: f'{r.dtype}/{r.precision}')}): results of "
            "different precisions cannot match"
        )
    if any(_compression(run) != "none" for run in runs):
        reasons.append(
            f"gradient compression ({_by_world_size(runs, _compression)}): the all-reduced "
            "gradients are rounded (bf16, fp16) or approximated (powersgd), and one process "
            "sends nothing to compress; verify without it (--compression none, "
            "MULTIGPU_COMPRESSION unset) or accept the difference (--rtol 1e-2 for bf16/fp16)"
        )
    ignored = _mean_over_ignored(runs)
    if ignored:
        reasons.append(ignored)
    batchnorm = _unsynchronized_batchnorm(runs, comparisons)
    if batchnorm:
        reasons.append(
            f"BatchNorm layers not synchronized ({_names(batchnorm)}) and their tensors differ: "
            "without multigpu.init(sync_batchnorm=True) their statistics cover only each "
            "rank's share of the batch, which shrinks as the world size grows"
        )
    return reasons


def _loader_reasons(runs: Sequence[RunRecord]) -> list[str]:
    reasons: list[str] = []
    batch = _loader_field("global_batch_size")
    if _differs(runs, batch):
        reasons.append(
            f"the loaders' global batch size differs between runs ({_by_world_size(runs, batch)})"
            ": a per-rank batch size? pass the GLOBAL batch to ctx.loader(batch_size=...), "
            "never scaled by ctx.world_size"
        )
    samples = _loader_field("num_samples")
    if _differs(runs, samples):
        reasons.append(
            "the loaders' number of samples differs between runs "
            f"({_by_world_size(runs, samples)}): the dataset depends on the world size (a "
            "per-rank subset?); give ctx.loader the whole dataset, it shards it"
        )
    accumulation = _loader_field("accumulation_steps")
    varied = any(run.accumulation is not None for run in runs)  # verify varies it
    if varied:  # the script must follow it, in one of its loaders (an eval loader keeps 1)
        ignored = [run for run in runs if run.accumulation not in _all_loaders(run)]
        if ignored:
            reasons.append(
                "the script does not follow --accumulation: its loaders' accumulation steps are "
                f"{_by_world_size(ignored, accumulation)}; verify passes --accumulation-steps K "
                "to the script: read it and give it to ctx.loader(..., accumulation_steps=K)"
            )
    for name, what in (("accumulation_steps", "accumulation steps"), ("seed", "seed")):
        field = _loader_field(name)
        if name == "accumulation_steps" and varied:
            continue
        if _differs(runs, field):
            reasons.append(
                f"the loaders' {what} differ between runs ({_by_world_size(runs, field)}): "
                f"keep the {what} the same at every world size"
            )
    return reasons


def _mean_over_ignored(runs: Sequence[RunRecord]) -> str | None:
    """Losses averaged per micro-batch over the targets that are not ``ignore_index``, where
    the share ignored varies: a share that is the same in every micro-batch of every run
    (transformers' one-token label shift of a causal LM ignores one target per sequence) weighs
    every item alike at any world size, and is not padding."""
    with_ignored = [run for run in runs if run.mean_over_ignored["calls"]]
    seen = [run.mean_over_ignored for run in with_ignored]
    if not seen:
        return None
    shares = {run.ignored_share for run in with_ignored}
    if len(shares) == 1 and None not in shares:
        return None
    ignored = sum(s["ignored"] for s in seen) / max(1, sum(s["targets"] for s in seen))
    return (
        "ctx.backward got cross-entropy means over targets of which some are ignore_index "
        f"(padding: {ignored:.0%} of them): each micro-batch's mean divides by its own count of "
        "the others, so a token weighs more in a micro-batch with more padding, and the "
        "micro-batches change with the world size and accumulation; sum the loss and pass the "
        "count: ctx.backward(F.cross_entropy(..., reduction='sum'), num_items=(labels != -100)"
        ".sum()) gives the gradient of the mean over every token of the step"
    )


def _compression(run: RunRecord) -> str:
    # Records of older versions have no "compression": nothing was compressed then.
    return str(run.main.get("compression") or "none")


def _unsynchronized_batchnorm(
    runs: Sequence[RunRecord], comparisons: Sequence[RunComparison]
) -> list[str]:
    """BatchNorm layers to blame: recorded as not synchronized in a run of several processes
    (at one process nothing is split), and among the tensors that differ (their running
    statistics are the first to show per-rank batches). Synchronized ones are the same on every
    rank: naming them would send the user after the wrong cause."""
    plain = {
        name
        for run in runs
        if run.world_size > 1
        for name, synced in run.batchnorm.items()
        if not synced
    }
    differing = {t.name for c in comparisons for t in c.tensors if not t.ok}
    return sorted(name for name in plain if any(t.startswith(f"{name}.") for t in differing))


def unexplained(comparisons: Sequence[RunComparison], runs: Sequence[RunRecord] = ()) -> str:
    """The line for a FAIL no record explains: the cause is unknown; what the records rule out,
    and what is typical."""
    ruled_out = ["Dropout", "per-rank batch size or data", "different step counts", "precision",
                 "gradient compression"]  # fmt: skip
    synced = sorted({n for run in runs for n, s in run.batchnorm.items() if s})
    if synced:
        ruled_out.append(f"BatchNorm (synchronized: {_names(synced)})")
    worst = max((c.max_rel for c in comparisons), default=0.0)
    weighted = bool(runs) and all(run.weighted_backward > 0 for run in runs)
    if weighted:  # every run's losses came with num_items: that cause is ruled out too
        ruled_out.append("losses averaged per micro-batch (num_items given)")
    return (
        f"cause unknown: the records rule out {', '.join(ruled_out)}; typical causes: "
        "float rounding, since sums over ranks (gradient all-reduce, synchronized statistics) "
        "add in a different order at each world size and a learning rate or momentum "
        f"compounds it (largest relative difference {worst:.2e}: if that small, raise --rtol), "
        "or code that depends on ctx.rank or ctx.world_size (per-rank seeds or data, a "
        "learning rate scaled by the world size)"
        + (
            ""
            if weighted
            else ", or a loss averaged per micro-batch over a varying number of items (a "
            "padding mask: sum it and pass ctx.backward(loss_sum, num_items=n))"
        )
    )


def nondeterminism_reason(rerun: RunComparison) -> str | None:
    """The reason to give when ``rerun`` (a second run at the reference world size, compared
    with the first) differs from it, else None."""
    if rerun.ok:
        return None
    if not rerun.losses.ok:
        what = f"first at the loss of step {rerun.losses.first_step}"
    elif rerun.steps != rerun.reference_steps:
        what = f"{rerun.steps} optimizer steps instead of {rerun.reference_steps}"
    else:
        what = f"parameters up to {rerun.max_rel:.2e} of their largest value"
    return NOT_DETERMINISTIC.format(ws=rerun.world_size, what=what)


def find_notes(runs: Sequence[RunRecord], steps_requested: int) -> list[str]:
    """What could not be compared, shown whatever the verdict.

    Example:
        >>> run = RunRecord(world_size=1, ranks=[{"steps": 5, "losses": [None] * 5}])
        >>> find_notes([run], 5)[0]
        'no losses recorded (the script does not call ctx.backward): losses not compared'
    """
    notes: list[str] = []
    if runs and all(all(v is None for v in run.losses) for run in runs):
        notes.append(
            "no losses recorded (the script does not call ctx.backward): losses not compared"
        )
    if runs and all(not run.params for run in runs):
        notes.append(
            "no model passed through ctx.setup: parameters not compared (only steps and losses)"
        )
    short = [run for run in runs if run.steps < steps_requested]
    if short:
        notes.append(
            f"the script ended before --steps {steps_requested} "
            f"({_by_world_size(short, lambda r: f'{r.steps} steps')}): compared at its end"
        )
    return notes


def adaptive_note(
    optimizers: Sequence[str], comparisons: Sequence[RunComparison], tol: Tolerance
) -> str:
    """Why an adaptive optimizer's run is judged on L2 differences, with the figures."""
    worst_max = max((c.max_rel for c in comparisons), default=0.0)
    worst_l2 = max((c.l2_rel for c in comparisons), default=0.0)
    return (
        f"{', '.join(dict.fromkeys(optimizers))} amplifies float rounding: a gradient that "
        "nearly cancels can change sign between world sizes and move its weight a full step "
        f"the other way, so single elements differ by up to {worst_max:.2e} of their tensor's "
        f"largest value; parameters were judged by their L2 difference instead (worst "
        f"{worst_l2:.2e}, tolerance {tol.l2_rtol:g}). With SGD the elements agree to about 1e-6"
    )

"""Why ``multigpu verify`` failed, found from hand-made records (pure, no processes)."""

from __future__ import annotations

from typing import Any

import torch

from multigpu.diagnostics.compare import Tolerance, compare_runs
from multigpu.diagnostics.diagnose import (
    find_notes,
    find_reasons,
    nondeterminism_reason,
    unexplained,
)
from multigpu.diagnostics.records import RunRecord

TOL = Tolerance(rtol=1e-5)
LOADER = {"global_batch_size": 32, "num_samples": 1024, "accumulation_steps": 1, "seed": 0}


def run(
    world_size: int,
    *,
    steps: int = 4,
    losses: list[float | None] | None = None,
    loaders: list[dict[str, Any]] | None = None,
    dropout: list[str] | None = None,
    params: dict[str, torch.Tensor] | None = None,
    recorded_world_size: int | None = None,
    precision: str = "32",
    batchnorm: dict[str, bool] | None = None,
) -> RunRecord:
    record = {
        "world_size": recorded_world_size or world_size,
        "steps": steps,
        "losses": [1.0, 0.9, 0.8, 0.7][:steps] if losses is None else losses,
        "loaders": [LOADER] if loaders is None else loaders,
        "dropout": dropout or [],
        "dtype": "float32",
        "precision": precision,
        "batchnorm": batchnorm or {},
    }
    ranks = [{**record, "rank": r} for r in range(world_size)]
    return RunRecord(
        world_size=world_size,
        ranks=ranks,
        params={"w": torch.ones(3)} if params is None else params,
    )


def reasons(*runs: RunRecord) -> list[str]:
    comparisons = [compare_runs(r, runs[0], TOL) for r in runs[1:]]
    return find_reasons(list(runs), comparisons)


def test_invariant_records_give_no_reason_and_no_note() -> None:
    assert reasons(run(1), run(2), run(4)) == []
    assert find_notes([run(1), run(2)], steps_requested=4) == []


def test_dropout_is_named_with_its_modules() -> None:
    found = reasons(run(1, dropout=["head.drop"]), run(2, dropout=["head.drop"]))
    assert len(found) == 1
    assert found[0].startswith("Dropout modules present ('head.drop')")
    assert "each rank draws its own dropout masks" in found[0]


def test_a_per_rank_batch_size_shows_as_a_global_batch_that_changes() -> None:
    found = reasons(
        run(1, loaders=[{**LOADER, "global_batch_size": 16}]),
        run(2, loaders=[{**LOADER, "global_batch_size": 32}]),
    )
    assert len(found) == 1
    assert (
        "global batch size differs between runs (16 at world size 1, 32 at world size 2)"
        in (found[0])
    )
    assert "per-rank batch size" in found[0]


def test_a_world_size_dependent_dataset_is_named() -> None:
    found = reasons(
        run(1, loaders=[{**LOADER, "num_samples": 1024}]),
        run(2, loaders=[{**LOADER, "num_samples": 512}]),
    )
    assert len(found) == 1
    assert (
        "number of samples differs between runs (1024 at world size 1, 512 at world size 2)"
        in (found[0])
    )


def test_accumulation_and_seed_differences_are_named() -> None:
    found = reasons(run(1), run(2, loaders=[{**LOADER, "accumulation_steps": 2, "seed": 1}]))
    assert any("accumulation steps differ" in r for r in found)
    assert any("seed differ" in r for r in found)


def test_different_step_counts() -> None:
    found = reasons(run(1, steps=4), run(2, steps=2))
    assert any(
        r.startswith("different numbers of optimizer steps (4 at world size 1, 2 at world size 2)")
        for r in found
    )


def test_no_ctx_loader_means_the_data_order_is_unchecked() -> None:
    found = reasons(run(1, loaders=[]), run(2, loaders=[]))
    assert found[0].startswith(
        "the script does not use ctx.loader: its data order may depend on the world size"
    )


def test_a_run_that_is_not_one_job_of_world_size_processes() -> None:
    found = reasons(run(1), run(2, recorded_world_size=1))
    assert "started with 2 processes recorded world size 1" in found[0]


def test_precision_differences_are_named() -> None:
    found = reasons(run(1), run(2, precision="bf16-mixed"))
    assert any("dtype or precision differs" in r for r in found)


def test_batchnorm_is_suspected_only_when_unsynchronized_and_its_tensors_differ() -> None:
    bn = {"bn.weight": torch.ones(2), "bn.running_mean": torch.zeros(2), "w": torch.ones(3)}
    moved = {"bn.weight": torch.ones(2), "bn.running_mean": torch.full((2,), 0.1), "w": bn["w"]}
    plain, synced = {"bn": False}, {"bn": True}
    assert reasons(run(1, params=bn, batchnorm=plain), run(2, params=bn, batchnorm=plain)) == []
    found = reasons(run(1, params=bn, batchnorm=plain), run(2, params=moved, batchnorm=plain))
    assert len(found) == 1 and found[0].startswith("BatchNorm layers not synchronized ('bn')")
    assert "sync_batchnorm=True" in found[0]
    # Synchronized (SyncBatchNorm): the same statistics on every rank, whatever differs.
    assert reasons(run(1, params=bn, batchnorm=plain), run(2, params=moved, batchnorm=synced)) == []
    # Not synchronized, but only another tensor differs: no evidence against BatchNorm.
    elsewhere = {**bn, "w": torch.full((3,), 1.5)}
    assert (
        reasons(run(1, params=bn, batchnorm=plain), run(2, params=elsewhere, batchnorm=plain)) == []
    )
    # A record that does not say (hand-made, older): running_mean alone proves nothing.
    assert reasons(run(1, params=bn), run(2, params=moved)) == []


def test_a_reference_that_does_not_repeat_itself_is_nondeterministic() -> None:
    first = run(1, losses=[1.0, 0.9, 0.8, 0.7])
    again = run(1, losses=[1.0, 0.95, 0.8, 0.7])
    reason = nondeterminism_reason(compare_runs(again, first, TOL))
    assert reason is not None
    assert reason.startswith("the script is not deterministic even at one world size")
    assert "step 2" in reason and "--deterministic" in reason
    assert nondeterminism_reason(compare_runs(first, first, TOL)) is None
    params_only = run(1, params={"w": torch.full((3,), 2.0)})
    assert "parameters up to" in (
        nondeterminism_reason(compare_runs(params_only, first, TOL)) or ""
    )


def test_unexplained_failure_says_unknown_what_was_ruled_out_and_what_is_typical() -> None:
    moved = compare_runs(run(2, params={"w": torch.full((3,), 1.5)}), run(1), TOL)
    line = unexplained([moved])
    assert line.startswith("cause unknown: the records rule out Dropout")
    assert "ctx.rank or ctx.world_size" in line and "5.00e-01" in line
    assert "float rounding" in line and "BatchNorm" not in line
    synced = [run(1, batchnorm={"bn": True}), run(2, batchnorm={"bn": True})]
    assert "BatchNorm (synchronized: 'bn')" in unexplained([moved], synced)


def test_notes_for_what_could_not_be_compared() -> None:
    no_losses = [run(1, losses=[None] * 4), run(2, losses=[None] * 4)]
    notes = find_notes(no_losses, steps_requested=4)
    assert notes == [
        "no losses recorded (the script does not call ctx.backward): losses not compared"
    ]
    no_model = [run(1, params={}), run(2, params={})]
    assert "no model passed through ctx.setup" in find_notes(no_model, 4)[0]
    short = find_notes([run(1, steps=2, losses=[1.0, 0.9]), run(2)], steps_requested=4)
    assert short == [
        "the script ended before --steps 4 (2 steps at world size 1): compared at its end"
    ]

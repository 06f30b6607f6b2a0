"""The pure comparison of ``multigpu verify``: tolerances, per-tensor diffs, losses, records."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from multigpu.diagnostics.compare import (
    Tolerance,
    compare_losses,
    compare_params,
    compare_runs,
    default_rtol,
    tensor_diff,
)
from multigpu.diagnostics.records import RunRecord, load_run


@pytest.mark.parametrize(
    ("dtype", "precision", "rtol"),
    [
        ("float32", "32", 1e-4),
        ("float64", "32", 1e-10),
        ("bfloat16", "32", 1e-2),
        ("float16", "32", 1e-2),
        ("float32", "bf16-mixed", 1e-2),
        ("float32", "16-mixed", 1e-2),
        (None, None, 1e-4),
    ],
)
def test_default_tolerance_follows_dtype_and_precision(dtype, precision, rtol) -> None:
    assert default_rtol(dtype, precision) == rtol


def test_relative_difference_is_against_the_tensors_largest_value_not_each_element() -> None:
    # Element-wise, 1e-9 vs 2e-9 is a 50% difference; against the tensor it is 1e-12.
    d = tensor_diff(
        "w",
        torch.tensor([1000.0, 1e-9], dtype=torch.float64),
        torch.tensor([1000.0, 2e-9], dtype=torch.float64),
        Tolerance(rtol=1e-10),
    )
    assert d.ok
    assert d.max_abs == pytest.approx(1e-9)
    assert d.max_rel == pytest.approx(1e-12)
    assert d.shape == (2,)


def test_tolerance_boundary_and_atol() -> None:
    # Exact binary fractions, so that the boundary is the boundary.
    ref = torch.tensor([2.0, -4.0], dtype=torch.float64)
    at_limit = torch.tensor([2.0, -3.0], dtype=torch.float64)  # |diff| 1 = 0.25 * max|b|
    over = torch.tensor([2.0, -2.875], dtype=torch.float64)
    assert tensor_diff("w", at_limit, ref, Tolerance(rtol=0.25)).ok
    assert not tensor_diff("w", over, ref, Tolerance(rtol=0.25)).ok
    assert tensor_diff("w", over, ref, Tolerance(rtol=0.25, atol=0.125)).ok
    assert not tensor_diff("w", at_limit, ref, Tolerance(rtol=0.0)).ok  # atol 0: exact
    assert tensor_diff("w", ref.clone(), ref, Tolerance(rtol=0.0)).ok


def test_all_zero_reference_does_not_divide_by_zero() -> None:
    d = tensor_diff("b", torch.zeros(3), torch.zeros(3), Tolerance(rtol=1e-5))
    assert (d.ok, d.max_abs, d.max_rel) == (True, 0.0, 0.0)
    d = tensor_diff("b", torch.tensor([1e-6, 0, 0]), torch.zeros(3), Tolerance(rtol=1e-5))
    assert not d.ok and math.isfinite(d.max_rel)


def test_nan_counts_as_equal_only_in_the_same_place() -> None:
    nan = float("nan")
    same = tensor_diff(
        "w", torch.tensor([nan, 1.0]), torch.tensor([nan, 1.0]), Tolerance(rtol=1e-5)
    )
    assert same.ok
    one_sided = tensor_diff(
        "w", torch.tensor([nan, 1.0]), torch.tensor([0.0, 1.0]), Tolerance(rtol=1e-5)
    )
    assert not one_sided.ok


def test_missing_extra_and_reshaped_tensors_fail_with_a_reason() -> None:
    ref = {"a": torch.ones(2), "b": torch.ones(3), "c": torch.ones(1)}
    run = {"a": torch.ones(2), "b": torch.ones(4), "d": torch.ones(1)}
    diffs = {d.name: d for d in compare_params(run, ref, Tolerance(rtol=1e-5))}
    assert diffs["a"].ok
    assert not diffs["b"].ok and "shape (4,) instead of (3,)" in diffs["b"].problem
    assert not diffs["c"].ok and diffs["c"].problem == "missing in this run"
    assert not diffs["d"].ok and diffs["d"].problem == "missing in the reference run"
    assert list(diffs) == ["a", "b", "c", "d"]


def test_first_differing_loss_step_is_one_based_and_skips_missing_losses() -> None:
    tol = Tolerance(rtol=1e-5)
    d = compare_losses([2.0, None, 1.5, 1.2, 0.1], [2.0, 1.9, 1.5, 1.0, 0.2], tol)
    assert d.compared == 4
    assert d.first_step == 4 and d.first_values == (1.2, 1.0)
    assert d.max_rel == pytest.approx(0.5)  # |0.1 - 0.2| / 0.2, the worst, after the first
    assert not d.ok
    ok = compare_losses([2.0, 1.5 * (1 + 5e-6)], [2.0, 1.5], tol)
    assert ok.ok and ok.first_step is None and ok.first_values is None


def test_a_nan_loss_on_one_side_differs() -> None:
    d = compare_losses([1.0, float("nan")], [1.0, 1.0], Tolerance(rtol=1e-2))
    assert d.first_step == 2 and math.isinf(d.max_abs)


def test_global_loss_is_the_mean_over_ranks() -> None:
    run = RunRecord(
        world_size=2,
        ranks=[{"losses": [1.0, 2.0, None]}, {"losses": [3.0, 4.0, 1.0]}],
    )
    assert run.losses == [2.0, 3.0, None]


def _run(world_size: int, steps: int, losses: list[float], w: torch.Tensor) -> RunRecord:
    ranks = [
        {"rank": r, "world_size": world_size, "steps": steps, "losses": losses}
        for r in range(world_size)
    ]
    return RunRecord(world_size=world_size, ranks=ranks, params={"w": w})


def test_compare_runs_needs_the_same_number_of_steps() -> None:
    tol = Tolerance(rtol=1e-5)
    ref = _run(1, 3, [1.0, 0.9, 0.8], torch.ones(4))
    same = compare_runs(_run(2, 3, [1.0, 0.9, 0.8], torch.ones(4)), ref, tol)
    assert same.ok and (same.world_size, same.reference_world_size) == (2, 1)
    fewer = compare_runs(_run(2, 2, [1.0, 0.9], torch.ones(4)), ref, tol)
    assert fewer.tensors_ok and fewer.losses.ok  # the steps both made agree...
    assert not fewer.ok  # ...but a run with fewer steps is not the same training
    moved = compare_runs(_run(2, 3, [1.0, 0.9, 0.8], torch.ones(4) * 1.001), ref, tol)
    assert not moved.ok and moved.max_rel == pytest.approx(1e-3, rel=1e-3)


def test_load_run_reads_what_the_probe_writes(tmp_path: Path) -> None:
    assert load_run(tmp_path, 2) is None  # nothing written: the script never called init()
    for rank in (0, 1):
        record = {"rank": rank, "world_size": 2, "steps": 2, "losses": [1.0 + rank, 2.0]}
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(record))
    torch.save({"fc.weight": torch.arange(3.0)}, tmp_path / "params.pt")
    run = load_run(tmp_path, 2)
    assert run is not None
    assert run.steps == 2 and run.recorded_world_size == 2
    assert run.losses == [1.5, 2.0]
    assert torch.equal(run.params["fc.weight"], torch.arange(3.0))


def test_adaptive_optimizers_judge_tensors_by_their_l2_difference() -> None:
    from multigpu.diagnostics.compare import Tolerance, tensor_diff

    reference = torch.linspace(1.0, 2.0, 1000)
    flipped = reference.clone()
    flipped[0] += 0.06  # one weight moved the other way (Adam: a sign flip)
    strict = tensor_diff("w", flipped, reference, Tolerance(rtol=1e-4))
    by_l2 = tensor_diff("w", flipped, reference, Tolerance(rtol=1e-4, l2_rtol=1e-2))
    assert strict.max_rel == by_l2.max_rel == pytest.approx(0.03, rel=1e-4)
    assert by_l2.l2_rel == pytest.approx(0.06 / float(reference.norm()), rel=1e-4)
    assert not strict.ok and by_l2.ok
    assert not tensor_diff("w", flipped * 1.1, reference, Tolerance(rtol=1, l2_rtol=1e-2)).ok

"""Tensors judged at noise level by ``multigpu verify``: the recorder's gradient ratios (on real
gloo processes, sharded by FSDP), the judgement, the report's line and JSON, and a constant share
of ignored targets that is not padding."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console

from multigpu.diagnostics.compare import (
    Tolerance,
    at_noise_level,
    compare_runs,
    noise_floor,
    tensor_diff,
)
from multigpu.diagnostics.diagnose import find_reasons
from multigpu.diagnostics.records import RunRecord, load_run
from multigpu.diagnostics.report import VerifyResult, render, to_json
from multigpu.testing import run_distributed
from tests.diagnostics import noise_workers

EPS32 = torch.finfo(torch.float32).eps
FLOOR32 = math.sqrt(EPS32)
NAMES = ["embed.weight", "q.weight", "q.bias", "k.weight", "k.bias", "v.weight", "v.bias",
         "head.weight", "head.bias"]  # fmt: skip


def _trained(tmp_path: Path, world_size: int) -> RunRecord:
    directory = tmp_path / f"ws{world_size}"
    env = {"MULTIGPU_VERIFY_DIR": str(directory), "MULTIGPU_VERIFY_STEPS": "0"}
    run_distributed(noise_workers.train, world_size, args=("fsdp",), env=env)
    record = load_run(directory, world_size)
    assert record is not None and record.steps == noise_workers.STEPS
    return record


def test_the_recorder_finds_the_key_bias_gradient_at_rounding_level_sharded_or_not(
    tmp_path: Path,
) -> None:
    one, two = _trained(tmp_path, 1), _trained(tmp_path, 2)
    for run in (one, two):
        ratios = run.gradient_noise
        assert sorted(ratios) == sorted(NAMES)
        assert ratios["k.bias"] <= FLOOR32 / 100, ratios  # of k.weight's; measured: ~1e-7
        assert min(r for name, r in ratios.items() if name != "k.bias") > 1e-2, ratios
    # every rank of the sharded run saw the whole gradients' norms (summed over the shards)
    assert two.ranks[0]["gradient_noise"] == two.ranks[1]["gradient_noise"]
    for name in NAMES:
        if name != "k.bias":
            assert math.isclose(one.gradient_noise[name], two.gradient_noise[name], rel_tol=1e-4)
    assert at_noise_level(two, one) == {"k.bias"}
    c = compare_runs(two, one, Tolerance(rtol=1e-4))
    assert c.ok and all(t.max_rel <= 1e-5 for t in c.tensors if t.name != "k.bias")


def test_squared_norms_sum_the_shards_of_an_fsdp_gradient() -> None:
    for sharded, whole in run_distributed(noise_workers.squared_norms_of_shards, 2):
        assert len(sharded) == len(NAMES)
        for a, b in zip(sharded, whole, strict=True):
            assert math.isclose(a, b, rel_tol=1e-6), (sharded, whole)


def _record(ws: int, params: dict[str, torch.Tensor], **rank: Any) -> RunRecord:
    same = {"rank": 0, "world_size": ws, "steps": 2, "losses": [1.0, 0.5], "loaders": [{}]}
    return RunRecord(world_size=ws, ranks=[{**same, "dtype": "float32", **rank}], params=params)


ONE = {"w": torch.ones(4), "k.bias": torch.tensor([1e-12, -2e-12, 0.0, 1e-12])}
TWO = {"w": torch.ones(4) + 1e-7, "k.bias": torch.tensor([-1e-12, 1e-12, 3e-13, 0.0])}


def _noise_runs(k_ratio: float, k_ratio_two: float | None = None) -> tuple[RunRecord, RunRecord]:
    ratios = {"w": 1.0, "k.bias": k_ratio}
    two = {**ratios, "k.bias": k_ratio if k_ratio_two is None else k_ratio_two}
    return _record(2, TWO, gradient_noise=two), _record(1, ONE, gradient_noise=ratios)


def test_a_tensor_whose_gradient_is_rounding_noise_in_both_runs_is_judged_at_noise_level() -> None:
    tol = Tolerance(rtol=1e-4)
    c = compare_runs(*_noise_runs(1e-7), tol)
    assert c.ok and c.noise_level == ("k.bias",)
    (k,) = [t for t in c.tensors if t.name == "k.bias"]
    assert k.ok and k.noise and math.isclose(k.max_rel, 1.0, rel_tol=1e-6)  # as large as it is
    assert c.max_rel < 2e-7  # the figures leave it out
    # Above the floor in either run, or no ratio recorded: judged by its difference, a FAIL.
    for two, one in (_noise_runs(1e-7, 1e-3), _noise_runs(1e-3, 1e-7)):
        c = compare_runs(two, one, tol)
        assert not c.ok and c.noise_level == () and math.isclose(c.max_rel, 1.0, rel_tol=1e-6)
    assert not compare_runs(_record(2, TWO), _record(1, ONE), tol).ok
    # Within tolerance anyway: simply OK, not named.
    c = compare_runs(_noise_runs(1e-7)[1], _noise_runs(1e-7)[1], tol)
    assert c.ok and c.noise_level == ()
    # A difference that is not finite is never excused.
    nan = tensor_diff("k.bias", torch.tensor([math.nan]), torch.tensor([1.0]), tol, noise=True)
    assert not nan.ok and not nan.noise


@pytest.mark.parametrize(
    ("dtype", "precision", "eps"),
    [
        ("float32", "32", EPS32),
        ("float64", "32", torch.finfo(torch.float64).eps),
        ("float32", "bf16-mixed", torch.finfo(torch.bfloat16).eps),
        ("float32", "16-mixed", torch.finfo(torch.float16).eps),
        (None, None, EPS32),
    ],  # the floor is the square root of the epsilon: half the digits
)
def test_the_noise_floor_is_the_root_of_the_epsilon_of_the_gradients_dtype(
    dtype: str | None, precision: str | None, eps: float
) -> None:
    assert noise_floor(dtype, precision) == math.sqrt(eps)


def _result(c: Any) -> VerifyResult:
    return VerifyResult(
        world_sizes=(1, 2),
        device="cpu",
        steps_requested=2,
        tolerance=Tolerance(rtol=1e-4),
        deterministic=False,
        runs=(),
        comparisons=(c,),
    )


def test_the_report_names_the_tensors_judged_at_noise_level_in_one_line() -> None:
    result = _result(compare_runs(*_noise_runs(1e-7), Tolerance(rtol=1e-4)))
    buf = io.StringIO()
    render(result, Console(file=buf, width=120, soft_wrap=True))
    lines = buf.getvalue().rstrip().splitlines()
    (line,) = [line for line in lines if line.startswith("judged at noise level")]
    assert line.startswith(
        "judged at noise level: 1 tensor (k.bias): at every step of both runs their gradient's "
        "root mean square was at most 3.5e-04 (the square root of float32's epsilon) of their "
        "module's gradients'"
    )
    assert "(up to 1.00e+00 of their largest value)" in line  # 2e-12 against 2e-12
    assert any("k.bias" in row and "noise" in row for row in lines)
    data = json.loads(json.dumps(to_json(result)))
    assert data["noise_level"] == ["k.bias"] and data["noise_floor"] == FLOOR32
    (c,) = data["comparisons"]
    assert c["noise_level"] == ["k.bias"]
    k = next(t for t in c["tensors"] if t["name"] == "k.bias")
    assert k["ok"] and k["noise_level"] is True
    assert "noise_level" not in next(t for t in c["tensors"] if t["name"] == "w")
    ok = _result(compare_runs(_record(2, ONE), _record(1, ONE), Tolerance(rtol=1e-4)))
    buf = io.StringIO()
    render(ok, Console(file=buf, width=120, soft_wrap=True))
    assert "noise level" not in buf.getvalue()


def test_a_constant_share_of_ignored_targets_is_not_padding() -> None:
    def run(ws: int, *shares: tuple[list[int], bool]) -> RunRecord:
        counts = {"calls": 4, "ignored": 8, "targets": 96}
        ranks = [
            {"loaders": [{}], "mean_over_ignored": {**counts, "share": share, "varies": varies}}
            for share, varies in shares
        ]
        return RunRecord(world_size=ws, ranks=ranks)

    shift = ([1, 12], False)  # transformers' causal LM: the last of 12 targets of each sequence
    assert run(2, shift, shift).ignored_share == (1, 12)
    assert find_reasons([run(1, shift), run(2, shift, shift)], []) == []
    for runs in (
        [run(1, shift), run(2, shift, ([1, 12], True))],  # varies within a rank
        [run(1, shift), run(2, shift, ([1, 6], False))],  # differs between ranks
        [run(1, ([1, 6], False)), run(2, shift, shift)],  # differs between runs
    ):
        (reason,) = find_reasons(runs, [])
        assert reason.startswith("ctx.backward got cross-entropy means over targets of which")
    # a record without the share (an older version's) keeps the reason
    old = RunRecord(world_size=1, ranks=[{"loaders": [{}], "mean_over_ignored": {"calls": 1}}])
    assert old.ignored_share is None and len(find_reasons([old, old], [])) == 1

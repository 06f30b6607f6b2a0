"""PipelineStrategy on real gloo processes: the unsplit model's numbers, resume, convert, refusals.

Two process starts for the training runs (one process: the unsplit reference; two: GPipe,
1F1B with checkpoints, 1F1B resumed from its step-25 checkpoint, interleaved 1F1B), one for
the refusals.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from multigpu.checkpoint.convert import to_file
from multigpu.testing import run_distributed
from tests.strategies import pipeline_workers

STEPS = 50


def max_relative(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(((a[k] - b[k]).abs().max() / (b[k].abs().max() + 1e-12)).item() for k in b)


@pytest.fixture(scope="module")
def alone() -> dict[str, Any]:
    (result,) = run_distributed(pipeline_workers.train, world_size=1, args=("single", STEPS))
    return result  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def piped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("pipeline")
    runs = [
        ("gpipe", STEPS),
        ("1f1b", STEPS, str(root / "whole")),
        ("1f1b", STEPS, str(root / "resumed"), None, 25),  # stopped at step 25 ...
        ("1f1b", STEPS, str(root / "resumed"), 25),  # ... and resumed from its checkpoint
        ("interleaved-1f1b", STEPS),
    ]
    rank0, rank1 = run_distributed(
        pipeline_workers.several, world_size=2, args=(runs,), timeout=240
    )
    names = ["gpipe", "1f1b", "stopped", "resumed", "interleaved"]
    return {
        "root": root,
        "rank0": dict(zip(names, rank0, strict=True)),
        "rank1": dict(zip(names, rank1, strict=True)),
    }


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved"])
def test_two_stages_train_like_the_unsplit_model(
    alone: dict[str, Any], piped: dict[str, Any], schedule: str
) -> None:
    run0, run1 = piped["rank0"][schedule], piped["rank1"][schedule]
    assert len(run0["losses"]) == STEPS
    assert run0["losses"] == run1["losses"]  # the loss on every rank, not only the last stage's
    assert max(abs(a - b) for a, b in zip(run0["losses"], alone["losses"], strict=True)) <= 1e-6
    # The whole model's gradient norm: each stage's part summed across the processes.
    assert run0["norms"] == run1["norms"]
    assert max(abs(a - b) for a, b in zip(run0["norms"], alone["norms"], strict=True)) <= 1e-5
    assert max(alone["norms"]) > pipeline_workers.MAX_NORM  # the clipping did something
    assert max_relative(run0["state"], alone["state"]) <= 1e-5
    assert max_relative(run0["state"], pipeline_workers_initial()) > 1e-2  # it trained
    assert run1["state"] == {}  # gathered on rank 0
    assert not set(run0["local"]) & set(run1["local"])  # each process holds its stages only
    assert run0["plain"] is run1["plain"] is True  # unwrapped as a SplitModel, keys unprefixed
    for run in (run0, run1):  # evaluation: the last stage's output on every rank
        assert torch.allclose(run["out"], alone["out"], atol=1e-5)
        assert run["evaluated"] == alone["evaluated"] == pipeline_workers.SAMPLES  # each once


def pipeline_workers_initial() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    from multigpu.runtime.seed import seed_everything

    seed_everything(0)
    return pipeline_workers.Net().state_dict()


def test_resumed_pipeline_ends_bitwise_equal(piped: dict[str, Any]) -> None:
    whole, resumed = piped["rank0"]["1f1b"], piped["rank0"]["resumed"]
    assert len(piped["rank0"]["stopped"]["losses"]) == 25
    assert resumed["losses"] == whole["losses"][25:]
    for name, tensor in whole["state"].items():
        assert torch.equal(resumed["state"][name], tensor), name


def test_convert_consolidates_the_stages_into_the_unsplit_model(
    piped: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "model.pt"
    to_file(piped["root"] / "whole" / "step-00000050", out, key=None, trust=False, force=False)
    net = pipeline_workers.Net()
    net.load_state_dict(torch.load(out, weights_only=True), strict=True)
    for name, tensor in piped["rank0"]["1f1b"]["state"].items():
        assert torch.equal(net.state_dict()[name], tensor), name


def test_bubble_is_measured_and_computed_from_the_schedule(piped: dict[str, Any]) -> None:
    bubble = piped["rank0"]["1f1b"]["bubble"]
    assert bubble["schedule"] == pytest.approx(1 / 5, abs=1e-3)  # (p-1)/(m+p-1), p=2, m=4
    assert piped["rank0"]["interleaved"]["bubble"]["schedule"] == pytest.approx(1 / 9, abs=1e-3)
    assert len(bubble["measured"]) == 2 and all(0 <= b < 1 for b in bubble["measured"])


def test_bad_pipelines_are_refused_in_one_line_before_any_step() -> None:
    kinds = ["name", "stages", "batch", "no-example"]
    said = run_distributed(pipeline_workers.several_refusals, world_size=2, args=(kinds,))[0]
    name, stages, batch, example = said
    assert "split point 'blocks.9' names no module of Net" in name and "blocks.1" in name
    assert "3 pipeline stages on 2 processes" in stages
    assert "10 samples does not split into 4" in batch
    assert "example batch" in example
    assert all("\n" not in line for line in said)

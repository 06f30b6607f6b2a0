"""Pipelines whose stages share parameters, and pipeline checkpoints that cross strategies.

A tied-embedding LM and a chain running one block twice, split in 2 or 4 stages, train equal to
the unsplit model under every schedule; the shared tensor stays one tensor (equal on every
holder, once in checkpoints, counted once by clipping). A pipeline checkpoint resumes under
FSDP, one process and another stage count, an FSDP one under a pipeline, the model and the
optimizer as saved; a refused resume is one line and leaves nothing. Three process starts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import multigpu
from multigpu.checkpoint.convert import to_file
from multigpu.checkpoint.native.sharded import read_metadata
from multigpu.testing import run_distributed
from tests.strategies import pipeline_shared_workers as w

PIPED = [
    ("lm", "gpipe"),
    ("lm", "1f1b"),
    ("lm", "interleaved-1f1b"),  # 4 stages: the embedding on process 0, the head on process 1
    ("reused", "1f1b"),  # blocks.0 runs in stage 0 and, again, in stage 1
    ("reused", "interleaved-1f1b"),  # ... in stages 0 and 2: both on process 0
]
RESUMED = ["pipeline->fsdp", "pipeline->interleaved", "fsdp->pipeline", "pipeline->single"]


def max_relative(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(((a[k] - b[k]).abs().max() / (b[k].abs().max() + 1e-12)).item() for k in b)


def optimizer_relative(a: dict[str, Any], b: dict[str, Any]) -> float:
    assert a["state"].keys() == b["state"].keys()
    assert a["param_groups"] == b["param_groups"]
    return max_relative(
        {f"{k}.{s}": v.float() for k, stats in a["state"].items() for s, v in stats.items()},
        {f"{k}.{s}": v.float() for k, stats in b["state"].items() for s, v in stats.items()},
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("shared")
    piped = [((kind, schedule), {}) for kind, schedule in PIPED]
    piped[1] = (("lm", "1f1b", str(root / "pipe")), {"every": 4})  # saves steps 4 and 8
    piped[4] = (piped[4][0], {"late": True})  # an optimizer of the stages' parameters only
    piped.append((("lm", "fsdp", str(root / "fsdp")), {"every": 4}))
    rank0, rank1 = run_distributed(w.several, world_size=2, args=(piped,), timeout=300)
    from_pipe = str(root / "pipe" / "step-00000004")
    from_fsdp = str(root / "fsdp" / "step-00000004")
    alone = [
        (("lm", "single"), {}),
        (("reused", "single"), {}),
        (("lm", "single", str(root / "to-single")), {"resume": from_pipe}),
    ]
    (single,) = run_distributed(w.several, world_size=1, args=(alone,), timeout=300)
    resumed = [
        (("lm", "fsdp", str(root / "to-fsdp")), {"resume": from_pipe}),
        (("lm", "interleaved-1f1b", str(root / "to-4")), {"resume": from_pipe}),
        (("lm", "1f1b", str(root / "to-pipe")), {"resume": from_fsdp}),
    ]
    again, _ = run_distributed(w.resumes, world_size=2, args=(resumed, str(root)), timeout=300)
    return {
        "root": root,
        "piped": {k: (r0, r1) for k, r0, r1 in zip(PIPED, rank0, rank1, strict=False)},
        "fsdp": rank0[-1],
        "single": {"lm": single[0], "reused": single[1]},
        "resumed": dict(zip(RESUMED, [*again["runs"], single[2]], strict=True)),
        "refused": again["refused"],
    }


@pytest.mark.parametrize(("kind", "schedule"), PIPED)
def test_shared_parameters_train_like_the_unsplit_model(
    runs: dict[str, Any], kind: str, schedule: str
) -> None:
    run0, run1 = runs["piped"][(kind, schedule)]
    alone = runs["single"][kind]
    assert len(run0["losses"]) == w.STEPS and run0["losses"] == run1["losses"]
    losses = zip(run0["losses"], alone["losses"], strict=True)
    assert max(abs(a - b) / abs(b) for a, b in losses) <= 1e-5
    # The gradient norm counts the shared tensor once: the clipping acts as unsplit.
    norms = zip(run0["norms"], alone["norms"], strict=True)
    assert max(abs(a - b) / abs(b) for a, b in norms) <= 1e-5
    assert max(alone["norms"]) > w.MAX_NORM
    assert run0["state"].keys() == alone["state"].keys()  # no "blocks.0@1.*", nothing missing
    assert max_relative(run0["state"], alone["state"]) <= 1e-5
    assert optimizer_relative(run0["optimizer"], alone["optimizer"]) <= 1e-5
    assert max_relative({"out": run0["out"]}, {"out": alone["out"]}) <= 1e-5  # traced again
    shared = set(run0["local"]) & set(run1["local"])
    if kind == "lm":
        assert shared == {"emb.weight", "head.weight"}
        assert torch.equal(run0["state"]["emb.weight"], run0["state"]["head.weight"])
    if (kind, schedule) == ("reused", "1f1b"):
        assert shared == {"blocks.0.0.weight", "blocks.0.0.bias"}
    for name in shared:  # every holder steps the same step: the copies stay bitwise equal
        assert torch.equal(run0["local"][name], run1["local"][name]), name


def test_a_tied_weight_is_saved_once_and_converts_for_a_strict_load(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    step = runs["root"] / "pipe" / "step-00000008"
    keys = set(read_metadata(step).state_dict_metadata)
    assert "model.emb.weight" in keys and "model.head.weight" not in keys
    assert "optimizer.state.emb.weight.exp_avg" in keys
    manifest = json.loads((step / "manifest.json").read_text())
    assert manifest["objects"]["model"]["tied"] == {"head.weight": "emb.weight"}
    to_file(step, tmp_path / "model.pt", key=None, trust=False, force=False)
    converted = torch.load(tmp_path / "model.pt", weights_only=True)
    assert converted["head.weight"].data_ptr() == converted["emb.weight"].data_ptr()  # one tensor
    net = w.TiedLM()
    net.load_state_dict(converted, strict=True)
    assert net.head.weight is net.emb.weight
    trained = runs["piped"][("lm", "1f1b")][0]["state"]
    assert all(torch.equal(net.state_dict()[k], v) for k, v in trained.items())
    fresh = w.TiedLM()
    multigpu.load_weights(fresh, step, strict=True)
    assert torch.equal(fresh.emb.weight, trained["emb.weight"])


@pytest.mark.parametrize("label", RESUMED)
def test_pipeline_checkpoints_resume_under_other_strategies_and_stage_counts(
    runs: dict[str, Any], label: str
) -> None:
    run = runs["resumed"][label]
    source = runs["fsdp"] if label.startswith("fsdp") else runs["piped"][("lm", "1f1b")][0]
    saved = source["saved"][4]
    # The model and the optimizer as they were at the save, whatever saved and loads them.
    assert run["resumed"]["state"].keys() == saved["state"].keys()
    assert all(torch.equal(run["resumed"]["state"][k], v) for k, v in saved["state"].items())
    assert optimizer_relative(run["resumed"]["optimizer"], saved["optimizer"]) == 0
    # ... and training goes on as the uninterrupted run did.
    assert len(run["losses"]) == w.STEPS - 4
    assert max_relative(run["state"], source["state"]) <= 1e-5
    assert optimizer_relative(run["optimizer"], source["optimizer"]) <= 1e-5


def test_a_refused_resume_is_one_line_on_every_rank_and_creates_nothing(
    runs: dict[str, Any],
) -> None:
    said, existed = runs["refused"]
    assert said.startswith("CheckpointMismatchError: checkpoint ")
    assert "missing: model.head.bias" in said and "\n" not in said
    assert not existed

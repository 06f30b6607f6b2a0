"""The zoo's decoders (GPT-2 with its tied embedding, Llama) under ``pipeline`` on 2 processes
equal the unsplit model trained on the same batches, wrapped to return logits or as
transformers builds them (key-value cache on, turned off by the pipeline): one process start."""

from __future__ import annotations

from typing import Any

import pytest

from multigpu.testing import run_distributed
from tests.zoo import pipeline_workers

pytestmark = pytest.mark.requires("module:transformers")
CASES = ["gpt2", "gpt2, as built", "llama", "llama, as built"]


@pytest.fixture(scope="module")
def runs() -> dict[str, Any]:
    rank0, rank1 = run_distributed(pipeline_workers.decoders, world_size=2, args=("1f1b",))
    assert all(run["state"] == {} for run in rank1.values())
    return rank0  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", CASES)
def test_a_decoder_in_two_stages_trains_like_the_unsplit_model(
    name: str, runs: dict[str, Any]
) -> None:
    if name not in runs:
        pytest.skip(pipeline_workers.LLAMA_BEFORE_5_24)
    run = runs[name]
    assert len(run["losses"]) == pipeline_workers.STEPS
    assert run["losses"] == pytest.approx(run["reference_losses"], rel=1e-5)
    assert run["state"].keys() == run["reference"].keys()  # one tensor per tied weight
    for key, want in run["reference"].items():
        diff = (run["state"][key] - want).abs().max().item()
        assert diff <= 1e-5 * want.abs().max().item() + 1e-9, (key, diff)

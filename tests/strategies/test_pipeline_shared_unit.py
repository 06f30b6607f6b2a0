"""What a pipeline's stages share, found in one process: torch's copies mapped back, leftovers
left out, one object per tensor on a process, and what cannot be mapped refused in one line."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.pipelining import SplitPoint, pipeline

from multigpu.errors import UsageError
from multigpu.strategies.pipeline.shared_tensors import ModelNames, SharedTensors, live_tensors
from tests.strategies.pipeline_shared_workers import SEQ, TiedLM

# torch 2.13's export warns of its own deprecated LeafSpec on every trace.
pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec:FutureWarning")


@pytest.fixture
def split() -> tuple[TiedLM, dict[int, nn.Module]]:
    torch.manual_seed(0)
    model = TiedLM()
    example = (torch.zeros(2, SEQ, dtype=torch.long),)
    pipe = pipeline(model, example, split_spec={"blocks.2": SplitPoint.BEGINNING})
    return model, {i: pipe.get_stage_module(i) for i in range(pipe.num_stages)}


def test_a_tied_weight_is_copied_into_both_stages_and_found_in_each(
    split: tuple[TiedLM, dict[int, nn.Module]],
) -> None:
    model, stages = split
    first, last = live_tensors(stages[0]), live_tensors(stages[1])
    # Stage 0 still holds the head's original weight, unused: a leftover, not what it runs.
    assert "head.weight" in dict(stages[0].named_parameters()) and "head.weight" not in first
    assert "emb.weight" in first and "head.weight" in last
    assert first["emb.weight"][2] is not last["head.weight"][2]  # torch's two copies
    names = ModelNames.of(model)
    assert names.tied() == {"head.weight": "emb.weight"}
    assert names.logical("head.weight", last["head.weight"][2]) == "emb.weight"


def test_stages_of_one_process_share_one_object_and_the_view_has_the_models_names(
    split: tuple[TiedLM, dict[int, nn.Module]],
) -> None:
    model, stages = split
    sharing = SharedTensors(ModelNames.of(model), stages, local=[0, 1], processes=1)
    assert sharing.shared() == {"emb.weight": [0, 1]} and sharing.crossing == []
    assert sharing.describe() == "emb.weight (= head.weight): stages 0, 1"
    assert live_tensors(stages[1])["head.weight"][2] is live_tensors(stages[0])["emb.weight"][2]
    view = sharing.plain_view()
    assert list(view.state_dict()) == list(model.state_dict())
    assert view.get_parameter("head.weight") is view.get_parameter("emb.weight")
    assert len(sharing.counted()) == len(list(model.parameters()))  # the tied one once


def test_a_tensor_that_maps_to_nothing_of_the_model_is_refused_in_one_line(
    split: tuple[TiedLM, dict[int, nn.Module]],
) -> None:
    _, stages = split
    other = nn.Module()
    other.emb = nn.Embedding(3, 2)  # not the model that was split
    with pytest.raises(UsageError) as caught:
        SharedTensors(ModelNames.of(other), stages, local=[0], processes=2)
    said = str(caught.value)
    assert "pipeline stage 0 runs 'emb.weight', which has shape (32, 16)" in said
    assert "\n" not in said

"""A resume reads the checkpoint into the tensors the model and the optimizer hold: no second copy
of either (2 gloo processes, DDP and FSDP; a fresh optimizer, whose state the resume makes).

The figures (peak RSS of a resume against the training's, 67M and 200M parameters) are
``benchmarks/resume_memory.py``'s; here the mechanism: DCP fills the optimizer's own state
tensors (the ones ``load_state_dict`` then keeps) and the parameters' storage.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from multigpu.testing import run_distributed
from tests.checkpoint import resume_workers


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_resume_loads_into_the_live_parameters_and_optimizer_state(
    tmp_path: Path, strategy: str
) -> None:
    directory = str(tmp_path / "ckpt")
    saved = run_distributed(
        resume_workers.resume_in_place, world_size=2, args=(strategy, directory, True)
    )
    resumed = run_distributed(
        resume_workers.resume_in_place, world_size=2, args=(strategy, directory, False)
    )
    for before, after in zip(saved, resumed, strict=True):
        assert after["params_after"] == after["params_before"]  # the same storage, refilled
        assert after["loaded"] and after["loaded"] == after["live"]  # DCP filled the state
        assert after["optimizer_after"] == after["live"]  # ... which load_state_dict kept
        assert after["hooked_steps"] == 0  # the state was made without a step the hooks saw
        assert all(torch.equal(before["state"][k], v) for k, v in after["state"].items())
        assert len(after["optimizer"]) == len(before["optimizer"]) > 0
        for mine, theirs in zip(after["optimizer"], before["optimizer"], strict=True):
            assert torch.equal(mine, theirs)

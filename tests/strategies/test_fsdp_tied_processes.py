"""FSDP on two gloo processes with shared parameters: tied weights and a module the blocks share.

Before multigpu kept the modules that share a parameter in one unit, the tied model's default
units were its embedding and its head, and the first forward failed in torch (``Parameter
'emb.weight' is shared with a parameter already managed by another FSDP group``). Each case
trains beside a plain copy of the model on the whole batch in the same process: one process
start in all.
"""

from __future__ import annotations

from typing import Any

import pytest

from multigpu.testing import run_distributed
from tests.strategies import fsdp_tied_workers

STEPS = 5


@pytest.fixture(scope="module")
def runs() -> dict[str, dict[str, Any]]:
    rank0, rank1 = run_distributed(
        fsdp_tied_workers.tied_runs, world_size=2, args=(STEPS,), timeout=180
    )
    assert all(run["state"] == {} for run in rank1.values())  # the whole state: rank 0's
    assert [run["units"] for run in rank1.values()] == [run["units"] for run in rank0.values()]
    return rank0  # type: ignore[no-any-return]


def test_shared_parameters_train_sharded_as_one_process_trains_them(
    runs: dict[str, dict[str, Any]],
) -> None:
    assert runs.keys() == fsdp_tied_workers.CASES.keys()
    for label, run in runs.items():
        state, plain = run["state"], run["plain"]
        assert state.keys() == plain.keys(), label
        for name, tensor in plain.items():
            diff = (state[name] - tensor).abs().max() / tensor.abs().max()
            assert diff <= 1e-5, (label, name, float(diff))


def test_the_units_keep_what_shares_a_parameter_together(runs: dict[str, dict[str, Any]]) -> None:
    assert runs["tied"]["units"] == ["emb+head", "<root>"]
    assert runs["tied"]["tied"] and runs["tied, embedding given"]["tied"]  # still one weight
    assert runs["tied, embedding given"]["units"] == ["<root>"]
    assert runs["shared module"]["units"] == ["blocks.0.shared", "blocks.0", "blocks.1", "<root>"]

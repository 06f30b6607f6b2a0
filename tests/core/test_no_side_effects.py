"""No process-wide side effect outlives a run: the wrappers of ``torch.distributed`` (hang
recorder, wait clock) exist only while a Context lives, and what a metric counts is the
Context's business, not a module global that a loader flips."""

from __future__ import annotations

from typing import Any

import pytest

from multigpu.testing import run_distributed
from tests.core import side_effect_workers


@pytest.fixture(scope="module")
def traced() -> list[dict[str, Any]]:
    return run_distributed(side_effect_workers.traced_while_a_context_lives, world_size=2)


def test_torch_distributed_is_wrapped_only_while_a_context_lives(
    traced: list[dict[str, Any]],
) -> None:
    for result in traced:
        assert result["log_inside"] is True and result["log_after"] is False
        assert {"all_reduce", "barrier", "broadcast", "Work.wait"} <= set(result["wrapped_inside"])
        assert result["left_wrapped"] == []  # every function torch's own again


def test_a_metric_counts_repeated_data_once_without_a_loader(
    traced: list[dict[str, Any]],
) -> None:
    # Under a pipeline every process reads the whole batch: rank 1's copy is not added again.
    assert [r["repeats"] for r in traced] == [False, True]
    for result in traced:
        assert (result["mean"], result["count"]) == (2.0, 2.0)

"""The tap on ``torch.distributed`` (``multigpu.runtime.collective_taps``) covers every function
that communicates which a strategy calls: DDP, FSDP2, the pipeline and tensor parallel train,
checkpoint, resume, evaluate a metric and read their throughput on two gloo processes, with every
public ``torch.distributed`` function recording its calls. A function they call that is neither
tapped nor known to stay local fails here: tap it (``TAPPED``) if it communicates, else name it in
``LOCAL``."""

from __future__ import annotations

from typing import Any

import pytest

from multigpu.runtime.collective_taps import NOT_TAPPED, TAPPED
from multigpu.testing import run_distributed
from tests.strategies import collective_coverage_workers as workers

LOCAL = {
    # what a process asks of its group, and the group's own life (its store, not a collective)
    "is_available",
    "is_initialized",
    "is_torchelastic_launched",
    "get_backend",
    "get_debug_level",
    "get_global_rank",
    "get_group_rank",
    "get_process_group_ranks",
    "get_rank",
    "get_world_size",
    "get_node_local_rank",
    "init_process_group",
    "destroy_process_group",
    "rendezvous",
    "new_group",
    "new_subgroups",
    "init_device_mesh",
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, dict[str, Any]]]:
    directory = tmp_path_factory.mktemp("ckpt")
    return run_distributed(workers.calls_of_each_strategy, world_size=2, args=(str(directory),))


def test_every_function_a_strategy_calls_is_tapped_or_local(
    runs: list[dict[str, dict[str, Any]]],
) -> None:
    for rank, by_kind in enumerate(runs):
        for kind, run in by_kind.items():
            unknown = set(run["called"]) - set(TAPPED) - set(NOT_TAPPED) - LOCAL
            assert not unknown, (
                f"rank {rank} under {kind} called torch.distributed.{sorted(unknown)}, which "
                "the tap does not cover: add each to collective_taps.TAPPED if it communicates, "
                "to LOCAL here if it does not"
            )
    called = {kind: set(run["called"]) for kind, run in runs[0].items()}
    # The recorder saw what each strategy is known to call (it records at all).
    assert {"all_gather_single", "reduce_scatter_single"} <= called["fsdp"]
    assert "batch_isend_irecv" in called["pipeline"]
    assert {"all_gather_object", "broadcast_object_list"} <= called["ddp"]  # checkpoints


def test_the_hang_explainer_and_the_wait_clock_hear_one_tap(
    runs: list[dict[str, dict[str, Any]]],
) -> None:
    for by_kind in runs:
        for run in by_kind.values():
            assert run["listeners"] == ["CollectiveLog", "WaitClock"]
        # The pipeline's sends and receives are recorded (the hang list once lacked them).
        assert "batch_isend_irecv" in by_kind["pipeline"]["recorded"]

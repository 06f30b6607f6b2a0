"""Same samples, same global order, at world size 1, 2 and 3 (real gloo processes); resume a
2-process run on 1 process (and on 3) with nothing skipped or repeated."""

from __future__ import annotations

from typing import Any

import pytest

from multigpu.testing import run_distributed
from tests.data import workers

# 125 = 10·12 + 5: the last global batch is partial (2 ranks: 3 + 2, 3 ranks: 2 + 2 + 1).
N, BATCH, STOP_AFTER = 125, 12, 3
WORLD_SIZES = (1, 2, 3)


@pytest.fixture(scope="module")
def runs() -> dict[int, list[dict[str, Any]]]:
    """Each world size's per-rank results; 1 and 3 also resume the 2-process run's state."""
    out = {2: run_distributed(workers.epochs_and_resume, 2, args=(N, BATCH, STOP_AFTER, None))}
    state = out[2][0]["state"]
    for world_size in (1, 3):
        out[world_size] = run_distributed(
            workers.epochs_and_resume, world_size, args=(N, BATCH, STOP_AFTER, state)
        )
    return out


def global_steps(per_rank: list[list[list[int]]]) -> list[list[int]]:
    """Each step's global batch: the ranks' slices of that step concatenated in rank order."""
    steps = max(len(batches) for batches in per_rank)
    return [
        [i for batches in per_rank if s < len(batches) for i in batches[s]] for s in range(steps)
    ]


def flat(steps: list[list[int]]) -> list[int]:
    return [i for step in steps for i in step]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_every_sample_is_seen_exactly_once_per_epoch(
    runs: dict[int, list[dict[str, Any]]], world_size: int
) -> None:
    ranks = runs[world_size]
    assert len(ranks) == world_size
    for epoch in range(2):
        seen = [flat(r["epochs"][epoch]) for r in ranks]
        assert sorted(i for part in seen for i in part) == list(range(N))
        counts = [len(part) for part in seen]
        assert max(counts) - min(counts) <= 1  # uneven only by the tail, never padded
    order0, order1 = (flat(global_steps([r["epochs"][e] for r in ranks])) for e in range(2))
    assert order0 != order1  # each pass is a new, reshuffled epoch


def test_the_global_order_does_not_depend_on_the_world_size(
    runs: dict[int, list[dict[str, Any]]],
) -> None:
    for key, steps_per_epoch in (("epochs", 11), ("dropping", 10)):
        for epoch in range(2):
            orders = {ws: global_steps([r[key][epoch] for r in runs[ws]]) for ws in WORLD_SIZES}
            assert len(orders[1]) == steps_per_epoch
            assert orders[2] == orders[1] and orders[3] == orders[1]  # batch by batch
    # Dropping the last partial batch drops exactly the tail of the same order.
    for epoch in range(2):
        kept = flat(global_steps([r["dropping"][epoch] for r in runs[1]]))
        assert kept == flat(runs[1][0]["epochs"][epoch])[: 10 * BATCH]


def test_resuming_a_two_process_run_on_one_or_three_processes(
    runs: dict[int, list[dict[str, Any]]],
) -> None:
    two = runs[2]
    assert two[0]["state"] == two[1]["state"]  # one portable state, whichever rank saves it
    assert (two[0]["state"]["epoch"], two[0]["state"]["cursor"]) == (1, STOP_AFTER * BATCH)
    before = flat(global_steps([r["before"] for r in two]))
    uninterrupted = flat(runs[1][0]["epochs"][1])
    assert before == uninterrupted[: STOP_AFTER * BATCH]
    for world_size in (1, 3):
        ranks = runs[world_size]
        after = flat(global_steps([r["after"] for r in ranks]))
        assert sorted(before + after) == list(range(N))  # nothing skipped, nothing repeated
        assert after == uninterrupted[STOP_AFTER * BATCH :]
        assert all(r["after_epoch"] == 2 for r in ranks)

"""Distributed evaluation on real gloo processes gives exactly the one-process numbers."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

import multigpu
from multigpu.testing import run_distributed
from tests.metrics import workers

N = workers.NUM_SAMPLES
# 1009 = 21·48 + 1: at 48 the last global batch is one sample, so only rank 0 gets a 22nd batch
# (48 divides by 1, 2 and 3). At 64 (2 ranks) the tail of 49 splits 25/24: equal batch counts,
# unequal sample counts. 64 is not divisible by 3, so 3 ranks use 48 only.
BATCHES = {2: [48, 64], 3: [48]}


def shard(rank: int, world_size: int, batch: int) -> list[int]:
    """Rank's indices, written out from docs/api.md: its slice of every full global batch, then
    its part of the tail (the first ``tail % world_size`` ranks get one more)."""
    per_rank, (steps, tail) = batch // world_size, divmod(N, batch)
    head = [s * batch + rank * per_rank + j for s in range(steps) for j in range(per_rank)]
    share, extra = divmod(tail, world_size)
    start = steps * batch + rank * share + min(rank, extra)
    return head + list(range(start, start + share + (rank < extra)))


@pytest.fixture(scope="module")
def reference() -> dict[Any, Any]:
    """The one-process values, straight from torch over the whole data set at once."""
    dataset, model = workers.problem()
    x, y, _ = dataset.tensors
    with torch.no_grad():
        logits = model(x)
    return {
        "accuracy": (logits.argmax(dim=1) == y).sum().item() / N,
        "top3": (logits.topk(3, dim=1).indices == y[:, None]).any(dim=1).sum().item() / N,
        "loss": F.cross_entropy(logits, y).item(),
        "label_sum": float(y.sum().item()),
        "preds": logits.argmax(dim=1),
    }


@pytest.fixture(scope="module")
def single() -> dict[Any, Any]:
    """The same worker code in this process, world size 1, no process group (on the CPU: a
    module fixture is set up before the autouse fixture that keeps tests off a GPU)."""
    with multigpu.init(seed=0, accelerator="cpu") as ctx:
        dataset, model = workers.problem()
        return {b: workers.evaluate(ctx, dataset, model, b) for b in (48, 64)}


@pytest.fixture(scope="module", params=[2, 3], ids=["2-ranks", "3-ranks"])
def ranks(request: pytest.FixtureRequest) -> list[dict[Any, Any]]:
    world_size = request.param
    results = run_distributed(
        workers.evaluate_at, world_size=world_size, args=(BATCHES[world_size],), timeout=120
    )
    assert [r["world_size"] for r in results] == [world_size] * world_size
    return results


def test_one_process_matches_plain_torch(single: dict[Any, Any], reference: dict[Any, Any]) -> None:
    for out in single.values():
        assert out["accuracy"] == reference["accuracy"]
        assert 0.2 < out["accuracy"] < 0.8  # a test data set that can tell right from wrong
        assert out["count"] == N
        assert out["top3"] == reference["top3"]
        assert out["loss"] == pytest.approx(reference["loss"], abs=1e-12)
        assert out["label_sum"] == reference["label_sum"]
        assert torch.equal(out["ordered_preds"], reference["preds"])


def test_uneven_ranks_finish_and_count_every_sample_once(ranks: list[dict[Any, Any]]) -> None:
    world_size = len(ranks)
    at48 = [r[48] for r in ranks]
    assert [r["batches"] for r in at48] == [22] + [21] * (world_size - 1)
    assert sum(r["local_count"] for r in at48) == N
    for batch in BATCHES[world_size]:
        counts = [r[batch]["local_count"] for r in ranks]
        assert sum(counts) == N and len(set(counts)) > 1  # uneven shards, nothing padded
        for r in ranks:
            assert r[batch]["count"] == N  # global after compute()
            assert r[batch]["loss_count"] == N
    if world_size == 2:
        assert [r[64]["batches"] for r in ranks] == [16, 16]
        assert [r[64]["local_count"] for r in ranks] == [505, 504]


def test_metrics_equal_the_one_process_values(
    ranks: list[dict[Any, Any]], single: dict[Any, Any], reference: dict[Any, Any]
) -> None:
    for r in ranks:
        for batch in BATCHES[len(ranks)]:
            out, alone = r[batch], single[batch]
            assert out["accuracy"] == out["accuracy_again"] == alone["accuracy"]
            assert out["accuracy"] == reference["accuracy"]  # exact, not approx
            assert out["top3"] == reference["top3"]
            assert out["label_sum"] == reference["label_sum"]
            assert abs(out["loss"] - alone["loss"]) <= 1e-12
            assert abs(out["batch_loss"] - alone["loss"]) <= 1e-12


def test_gathered_predictions_come_back_in_dataset_order(
    ranks: list[dict[Any, Any]], reference: dict[Any, Any]
) -> None:
    world_size = len(ranks)
    for batch in BATCHES[world_size]:
        expected_major = [i for rank in range(world_size) for i in shard(rank, world_size, batch)]
        for r in ranks:
            out = r[batch]
            assert out["sampler_indices_match"]
            major = out["rank_major_indices"]
            assert major.shape == (N,) and sorted(major.tolist()) == list(range(N))
            assert major.tolist() == expected_major
            assert not torch.equal(major, torch.arange(N))  # really not dataset order
            assert torch.equal(out["rank_major_preds"], reference["preds"][major])
            assert torch.equal(out["ordered_preds"], reference["preds"])
            assert torch.equal(out["ordered_indices"], torch.arange(N))


def test_a_rank_without_any_sample_still_computes(ranks: list[dict[Any, Any]]) -> None:
    world_size = len(ranks)
    tiny = [r["tiny"] for r in ranks]
    assert [t["batches"] for t in tiny] == [1] * (world_size - 1) + [0]
    for t in tiny:
        assert t["count"] == world_size - 1
        assert t["ordered_indices"].tolist() == list(range(world_size - 1))


def test_duplicated_indices_are_refused_on_every_rank(ranks: list[dict[Any, Any]]) -> None:
    for r in ranks:
        assert f"saw {len(ranks) - 1} dataset indices more than once" in r["duplicate_error"]

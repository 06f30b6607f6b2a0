"""Metric accumulators in one process (world size 1: compute() needs no process group)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from multigpu.errors import UsageError
from multigpu.session.metrics import Accuracy, Mean, Sum, gather_all, gather_in_dataset_order


def test_mean_of_per_sample_values_and_weighted_batch_means() -> None:
    per_sample, per_batch = Mean(), Mean()
    batches = [torch.tensor([1.0, 2.0, 3.0]), torch.tensor([10.0])]
    for b in batches:
        per_sample.update(b)
        per_batch.update(b.mean(), weight=len(b))
    assert per_sample.count == per_batch.count == 4
    assert per_sample.compute() == per_batch.compute() == 4.0  # not the mean of means (6.0)


def test_mean_with_per_sample_weights_and_numbers() -> None:
    m = Mean()
    m.update(torch.tensor([1.0, 3.0]), weight=torch.tensor([3.0, 1.0]))
    m.update(0.5, weight=0)
    assert m.compute() == 1.5 and m.count == 4


def test_mean_keeps_float64_sums() -> None:
    m = Mean()
    m.update(torch.full((3,), 1e15, dtype=torch.float64))
    m.update(torch.tensor([3.0], dtype=torch.float64))
    assert m.compute() == 750_000_000_000_000.75  # a float32 state would lose the 3


def test_sum_counts_elements() -> None:
    s = Sum()
    s.update(torch.tensor([[1, 2], [3, 4]]))
    s.update(2.5)
    assert (s.compute(), s.count) == (12.5, 5)


def test_accuracy_top1_topk_and_predicted_classes() -> None:
    logits = torch.tensor([[0.1, 0.5, 0.4], [0.7, 0.2, 0.1], [0.2, 0.3, 0.5], [0.0, 0.9, 0.1]])
    target = torch.tensor([1, 1, 0, 2])
    top1, top2, preds = Accuracy(), Accuracy(top_k=2), Accuracy()
    top1.update(logits, target)
    top2.update(logits, target)
    preds.update(logits.argmax(dim=1), target)
    assert top1.compute() == preds.compute() == 0.25
    assert top2.compute() == 0.75  # rows 0, 1 (0.2 is second) and 3 (0.1 vs 0.0)
    assert top1.count == 4


def test_accuracy_over_extra_dims_like_cross_entropy() -> None:
    logits = torch.zeros(2, 3, 4)  # [N, C, L]
    logits[:, 2, :] = 1.0
    target = torch.tensor([[2, 2, 0, 1], [2, 0, 0, 0]])
    acc = Accuracy()
    acc.update(logits, target)
    assert (acc.compute(), acc.count) == (3 / 8, 8)


@pytest.mark.parametrize(
    ("top_k", "scores", "target"),
    [
        (1, torch.zeros(4, 3), torch.zeros(3, dtype=torch.long)),  # wrong N
        (1, torch.zeros(4, 3, 2), torch.zeros(4, dtype=torch.long)),  # missing dim
        (4, torch.zeros(4, 3), torch.zeros(4, dtype=torch.long)),  # top_k > classes
        (2, torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long)),  # preds, top_k 2
    ],
)
def test_accuracy_refuses_shapes_it_cannot_score(
    top_k: int, scores: torch.Tensor, target: torch.Tensor
) -> None:
    with pytest.raises(UsageError, match=r"expected logits \[N, C, \.\.\.\]"):
        Accuracy(top_k=top_k).update(scores, target)


@pytest.mark.parametrize("top_k", [0, -1, 1.0, True])
def test_accuracy_refuses_a_bad_top_k(top_k: object) -> None:
    with pytest.raises(UsageError, match="expected an integer >= 1"):
        Accuracy(top_k=top_k)  # type: ignore[arg-type]


def test_bad_values_and_weights_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="value is a str"):
        Mean().update("1.0")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="does not broadcast"):
        Mean().update(torch.ones(3), weight=torch.ones(2))


def test_nothing_seen_is_nan_for_ratios_and_zero_for_sums() -> None:
    assert math.isnan(Mean().compute())
    assert math.isnan(Accuracy().compute())
    assert Sum().compute() == 0.0


def test_reset_and_compute_again() -> None:
    m = Mean()
    m.update(torch.tensor([2.0, 4.0]))
    assert m.compute() == m.compute() == 3.0  # computing twice does not double-count
    m.reset()
    assert m.count == 0
    m.update(1.0)
    assert (m.compute(), m.count) == (1.0, 1)


def test_state_dict_round_trip_through_torch_save(tmp_path: Path) -> None:
    acc = Accuracy()
    acc.update(torch.tensor([1, 2, 3]), torch.tensor([1, 0, 3]))
    torch.save(acc.state_dict(), tmp_path / "acc.pt")
    restored = Accuracy()
    restored.load_state_dict(torch.load(tmp_path / "acc.pt", weights_only=True))
    restored.update(torch.tensor([0]), torch.tensor([0]))
    assert (restored.compute(), restored.count) == (0.75, 4)


@pytest.mark.parametrize(
    "state", [Sum().state_dict(), {"metric": "Mean", "state": [1.0]}, [1.0, 2.0], {}]
)
def test_load_state_dict_refuses_other_states(state: object) -> None:
    with pytest.raises(UsageError, match=r"expected the dict returned by Mean\(\)\.state_dict"):
        Mean().load_state_dict(state)  # type: ignore[arg-type]


def test_gather_all_at_world_size_one() -> None:
    assert torch.equal(gather_all(torch.tensor([[1, 2], [3, 4]])), torch.tensor([[1, 2], [3, 4]]))
    assert torch.equal(gather_all(torch.tensor(5)), torch.tensor([5]))
    with pytest.raises(UsageError, match="expected a tensor"):
        gather_all([1, 2])  # type: ignore[arg-type]


def test_gather_in_dataset_order_sorts_rows_by_index() -> None:
    rows = torch.tensor([[30.0, 3.0], [10.0, 1.0], [20.0, 2.0]])
    ordered = gather_in_dataset_order(rows, torch.tensor([2, 0, 1]))
    assert torch.equal(ordered, torch.tensor([[10.0, 1.0], [20.0, 2.0], [30.0, 3.0]]))


@pytest.mark.parametrize(
    ("values", "indices"),
    [
        (torch.zeros(3), torch.tensor([0, 1])),
        (torch.zeros(2), torch.tensor([0.0, 1.0])),
        (torch.zeros(2), torch.tensor([[0, 1]])),
        (torch.tensor(1.0), torch.tensor([0])),
        ([0.0, 1.0], torch.tensor([0, 1])),
    ],
)
def test_gather_in_dataset_order_refuses_mismatched_input(values: object, indices: object) -> None:
    with pytest.raises(UsageError, match="expected N rows and a 1-D integer tensor"):
        gather_in_dataset_order(values, indices)  # type: ignore[arg-type]


def test_gather_in_dataset_order_refuses_duplicates() -> None:
    with pytest.raises(UsageError, match="saw 1 dataset indices more than once"):
        gather_in_dataset_order(torch.zeros(3), torch.tensor([4, 1, 4]))

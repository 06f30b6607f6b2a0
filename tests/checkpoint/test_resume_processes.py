"""Exact resume, and resume on another world size, with real gloo processes.

A run "killed" after some steps (the worker returns without a final save) and resumed from its
newest checkpoint must end bitwise equal to an uninterrupted run at the same world size — with
dropout, momentum and an LR scheduler, so RNG, optimizer and scheduler state all matter — and
within the "same results" bound at another world size, having trained on every sample of the
interrupted epoch exactly once.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from multigpu.testing import run_distributed
from tests.checkpoint import workers

STEPS_PER_EPOCH = workers.SAMPLES // workers.BATCH  # 12: the last partial batch is dropped


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _relative(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(((a[k] - b[k]).abs().max() / b[k].abs().max()).item() for k in b)


@pytest.mark.parametrize(
    ("world_size", "stop_at", "resumed_at", "async_save"),
    [
        (1, 17, 15, False),  # mid-epoch, two steps after the last checkpoint: they are redone
        (2, 13, 12, False),  # the checkpoint of an epoch's last step: resume in the next epoch
        (2, 20, 18, True),  # background saves
    ],
)
def test_a_resumed_run_is_bitwise_equal_to_an_uninterrupted_one(
    tmp_path: Path, world_size: int, stop_at: int, resumed_at: int, async_save: bool
) -> None:
    args = (0.3, 3, async_save)  # dropout, every_steps, async
    full = run_distributed(
        workers.train, world_size=world_size, args=(str(tmp_path / "a"), None, *args)
    )
    run_distributed(
        workers.train, world_size=world_size, args=(str(tmp_path / "b"), stop_at, *args)
    )
    resumed = run_distributed(
        workers.train, world_size=world_size, args=(str(tmp_path / "b"), None, *args)
    )
    for a, b in zip(full, resumed, strict=True):
        assert b["resumed"] == resumed_at
        assert b["steps"] == a["steps"] == 2 * STEPS_PER_EPOCH
        assert _equal(b["state"], a["state"])
    if world_size == 1:  # dropout really draws random numbers: the RNG state matters
        (plain,) = run_distributed(
            workers.train, world_size=1, args=(str(tmp_path / "c"), None, 0.0, 3)
        )
        assert not _equal(full[0]["state"], plain["state"])


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2)])
def test_resume_on_another_world_size_trains_each_sample_of_the_epoch_once(
    tmp_path: Path, before: int, after: int
) -> None:
    stop = STEPS_PER_EPOCH + 6  # mid-way through the second epoch, on a checkpoint
    (reference,) = run_distributed(
        workers.train, world_size=1, args=(str(tmp_path / "ref"), None, 0.0, 3)
    )
    first = run_distributed(
        workers.train, world_size=before, args=(str(tmp_path / "ck"), stop, 0.0, 3)
    )
    second = run_distributed(
        workers.train, world_size=after, args=(str(tmp_path / "ck"), None, 0.0, 3)
    )
    assert {r["resumed"] for r in second} == {stop}
    epoch1 = Counter(i for r in first + second for i in r["seen"].get(1, []))
    assert len(epoch1) == STEPS_PER_EPOCH * workers.BATCH  # 192 distinct samples
    assert set(epoch1.values()) == {1}  # none repeated, none skipped
    assert set(epoch1) == set(reference["seen"][1])  # the same global order as at world size 1
    for r in second:
        assert _relative(r["state"], reference["state"]) <= 1e-5


def test_a_tracked_object_missing_from_the_checkpoint_is_an_error(tmp_path: Path) -> None:
    (message,) = run_distributed(
        workers.save_then_resume_missing, world_size=1, args=(str(tmp_path),)
    )
    assert "no state for ['optimizer']" in message and "it holds ['model']" in message

"""Exact resume, and resume on another world size, with real gloo processes.

A run "killed" after some steps (the worker returns without a final save) and resumed from its
newest checkpoint in a fresh process must end bitwise equal to an uninterrupted run at the same
world size — with dropout, momentum and an LR scheduler, so RNG, optimizer and scheduler state all
matter — and within the "same results" bound at another world size, having trained on every
sample of the interrupted epoch exactly once.

Process starts dominate the time of these tests (~4 s each on 2 cores), so runs that need no
fresh process of their own (an uninterrupted run, a run to be interrupted) share one through
``workers.train_runs``; every resume starts in a new process.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from multigpu.testing import run_distributed
from tests.checkpoint import workers

STEPS_PER_EPOCH = workers.SAMPLES // workers.BATCH  # 12: the last partial batch is dropped
DROPOUT = 0.3
EVERY = 3  # checkpoint every 3 steps


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _relative(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(((a[k] - b[k]).abs().max() / b[k].abs().max()).item() for k in b)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An uninterrupted run at world size 1 without dropout: the cross-world-size baseline."""
    directory = tmp_path_factory.mktemp("reference")
    (result,) = run_distributed(
        workers.train, world_size=1, args=(str(directory), None, 0.0, EVERY)
    )
    return result  # type: ignore[no-any-return]


def test_a_resumed_run_is_bitwise_equal_to_an_uninterrupted_one_at_world_size_1(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    (runs,) = run_distributed(
        workers.train_runs,
        world_size=1,
        # mid-epoch, two steps after the last checkpoint (15): those two are redone
        args=([(a, None, DROPOUT, EVERY), (b, 17, DROPOUT, EVERY)],),
    )
    (resumed,) = run_distributed(workers.train, world_size=1, args=(b, None, DROPOUT, EVERY))
    full = runs[0]
    assert resumed["resumed"] == 15
    assert resumed["steps"] == full["steps"] == 2 * STEPS_PER_EPOCH
    assert _equal(resumed["state"], full["state"])
    # Dropout really draws random numbers, so restoring the RNG state is what made them equal.
    assert not _equal(full["state"], reference["state"])


def test_resumed_runs_are_bitwise_equal_at_world_size_2_after_sync_and_async_saves(
    tmp_path: Path,
) -> None:
    a, b, c = (str(tmp_path / name) for name in "abc")
    first = run_distributed(
        workers.train_runs,
        world_size=2,
        args=(
            [
                (a, None, DROPOUT, EVERY, False),  # uninterrupted, synchronous saves
                (b, 13, DROPOUT, EVERY, False),  # stops after the checkpoint of an epoch's end
                (c, 20, DROPOUT, EVERY, True),  # background saves, two steps after the last
            ],
        ),
    )
    second = run_distributed(
        workers.train_runs,
        world_size=2,
        args=([(b, None, DROPOUT, EVERY, False), (c, None, DROPOUT, EVERY, True)],),
    )
    for runs, (from_sync, from_async) in zip(first, second, strict=True):
        full = runs[0]
        assert (from_sync["resumed"], from_async["resumed"]) == (12, 18)
        for resumed in (from_sync, from_async):
            assert resumed["steps"] == full["steps"] == 2 * STEPS_PER_EPOCH
            assert _equal(resumed["state"], full["state"])


def test_resume_on_another_world_size_trains_each_sample_of_the_epoch_once(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    stop = STEPS_PER_EPOCH + 6  # mid-way through the second epoch, on a checkpoint
    x, y = str(tmp_path / "2to1"), str(tmp_path / "1to2")
    stopped_at_2 = run_distributed(workers.train, world_size=2, args=(x, stop, 0.0, EVERY))
    (runs,) = run_distributed(
        workers.train_runs, world_size=1, args=([(x, None, 0.0, EVERY), (y, stop, 0.0, EVERY)],)
    )
    resumed_at_1, stopped_at_1 = runs
    resumed_at_2 = run_distributed(workers.train, world_size=2, args=(y, None, 0.0, EVERY))
    for label, first, second in (
        ("2 -> 1", stopped_at_2, [resumed_at_1]),
        ("1 -> 2", [stopped_at_1], resumed_at_2),
    ):
        assert {r["resumed"] for r in second} == {stop}, label
        epoch1 = Counter(i for r in first + second for i in r["seen"].get(1, []))
        assert len(epoch1) == STEPS_PER_EPOCH * workers.BATCH, label  # 192 distinct samples
        assert set(epoch1.values()) == {1}, label  # none repeated, none skipped
        assert set(epoch1) == set(reference["seen"][1]), label  # world size 1's global order
        for r in second:
            assert _relative(r["state"], reference["state"]) <= 1e-5, label


def test_a_tracked_object_missing_from_the_checkpoint_is_an_error(tmp_path: Path) -> None:
    (message,) = run_distributed(
        workers.save_then_resume_missing, world_size=1, args=(str(tmp_path),)
    )
    assert "no state for ['optimizer']" in message and "it holds ['model']" in message

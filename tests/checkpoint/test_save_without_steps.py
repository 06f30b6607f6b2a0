"""Every ``ckpt.save()`` saves the state as it is, whether ``step()`` counted the steps or not.

The PyTorch DDP tutorial ported to a Checkpointer saves once per epoch and never calls
``step()``: each save is a checkpoint of its own (``step-00000000``, ``.1``, ``.2``...), a resume
takes the last and continues after it. Only a save with nothing moved since the last one (no
optimizer step, no batch handed out) is not written again. Real gloo processes for the loop;
one process for the names, the skip and the pruning.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import multigpu
from multigpu.checkpoint.dispatch import summarize
from multigpu.checkpoint.native.layout import (
    find_latest,
    list_checkpoints,
    parse_order,
    step_dir_name,
    unfinished_order,
)
from multigpu.testing import run_distributed
from tests.checkpoint import resume_workers

EPOCHS = 5


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_three_saves_without_step_leave_three_resumable_states_and_resume_continues_after_the_last(
    tmp_path: Path,
) -> None:
    whole, stopped = str(tmp_path / "whole"), str(tmp_path / "stopped")
    first = run_distributed(
        resume_workers.tutorial_runs,
        world_size=2,
        args=([(whole, EPOCHS, None), (stopped, EPOCHS, 3)],),
    )
    names = ["step-00000000", "step-00000000.1", "step-00000000.2"]
    for full, cut in first:
        assert [Path(s["path"]).name for s in cut["saved"]] == names
        assert cut["again"] == cut["saved"][-1]["path"]  # nothing moved: not written again
        assert [Path(s["path"]).name for s in full["saved"]][-1] == "step-00000000.4"
    assert [s.path.name for s in list_checkpoints(stopped)] == names
    assert all(s.complete for s in list_checkpoints(stopped))
    paths = [s["path"] for s in first[0][1]["saved"]]
    second = run_distributed(
        resume_workers.tutorial_resumed, world_size=2, args=(stopped, EPOCHS, paths)
    )
    for rank, resumed in enumerate(second):
        full, cut = first[rank]
        assert resumed["start"] == 3  # after the last save's epoch: none trained again
        assert [s["epoch"] for s in resumed["saved"]] == [3, 4]
        assert [Path(s["path"]).name for s in resumed["saved"]] == [
            "step-00000000.3",
            "step-00000000.4",
        ]
        assert _equal(resumed["state"], full["state"])  # as the uninterrupted run
        for saved, loaded in zip(cut["saved"], resumed["loaded"], strict=True):
            assert loaded["epoch"] == saved["epoch"] + 1
            assert _equal(loaded["state"], saved["state"])  # each of the three resumes
        assert not _equal(resumed["loaded"][0]["state"], resumed["loaded"][2]["state"])


@pytest.fixture
def ctx() -> Iterator[multigpu.Context]:
    with multigpu.init(seed=0, accelerator="cpu", environ={}) as context:
        yield context


def _train(ctx: multigpu.Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    ctx.backward(model(torch.ones(2, 3)).square().mean())
    ctx.step(optimizer)


def test_a_save_with_nothing_moved_is_not_written_again(
    ctx: multigpu.Context, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = ctx.setup(model, optimizer)
    ckpt = ctx.checkpointer(tmp_path, every_steps=2, model=model, optimizer=optimizer)
    for _ in range(2):
        _train(ctx, model, optimizer)
        ckpt.step()  # the second one saves step 2
    with caplog.at_level(logging.INFO, logger="multigpu.checkpoint.native.manager"):
        assert ckpt.save() == tmp_path / "step-00000002"  # the loop's own final save
    assert "nothing moved since" in caplog.text and "not saved again" in caplog.text
    assert [p.name for p in tmp_path.glob("step-*")] == ["step-00000002"]
    ckpt.close()
    again = ctx.checkpointer(tmp_path, model=model, optimizer=optimizer)
    assert again.resume() == 2
    assert again.save() == tmp_path / "step-00000002"  # a save right after a resume
    _train(ctx, model, optimizer)  # the optimizer moved, the count did not
    assert again.save() == tmp_path / "step-00000002.1"
    assert find_latest(tmp_path).path.name == "step-00000002.1"  # type: ignore[union-attr]
    again.close()


def test_saves_at_one_step_count_are_ordered_pruned_and_said_once(
    ctx: multigpu.Context, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = ctx.setup(model, optimizer)
    ckpt = ctx.checkpointer(tmp_path, keep=2, model=model, optimizer=optimizer)
    with caplog.at_level(logging.WARNING, logger="multigpu.checkpoint.native.manager"):
        names = []
        for _ in range(4):
            _train(ctx, model, optimizer)
            names.append(ckpt.save().name)
    assert names == ["step-00000000", "step-00000000.1", "step-00000000.2", "step-00000000.3"]
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "call ckpt.step() once per optimizer step" in said[0]
    assert [s.path.name for s in list_checkpoints(tmp_path)] == names[2:]  # keep=2, by order
    _train(ctx, model, optimizer)
    ckpt.step()
    assert ckpt.save().name == "step-00000001"  # a new count: its first save
    assert [s.path.name for s in list_checkpoints(tmp_path)] == ["step-00000000.3", "step-00000001"]
    described = summarize(tmp_path)
    assert described["newest_complete"] == "step-00000001"
    assert [c["name"] for c in described["checkpoints"]] == ["step-00000000.3", "step-00000001"]
    ckpt.close()


def test_with_neither_a_loader_nor_an_optimizer_tracked_every_save_writes(
    ctx: multigpu.Context, tmp_path: Path
) -> None:
    model = ctx.setup(torch.nn.Linear(3, 2))
    ckpt = ctx.checkpointer(tmp_path, model=model)
    assert [ckpt.save().name for _ in range(2)] == ["step-00000000", "step-00000000.1"]
    ckpt.close()


def test_names_order_as_the_saves_were_made() -> None:
    assert step_dir_name(7) == "step-00000007" and step_dir_name(7, 12) == "step-00000007.12"
    names = ["step-00000001", "step-00000000.10", "step-00000000.2", "step-00000000"]
    assert sorted(names, key=lambda n: parse_order(n) or (-1, 0)) == [
        "step-00000000",
        "step-00000000.2",
        "step-00000000.10",
        "step-00000001",
    ]
    assert parse_order("step-00000000.0") is None and parse_order("step-00000000.") is None
    assert unfinished_order(Path(".tmp-step-00000003.2-ab12cd34")) == (3, 2)
    assert unfinished_order(Path(".tmp-step-00000003-ab12cd34")) == (3, 0)


def test_an_unfinished_further_save_is_named_and_the_one_before_is_used(
    ctx: multigpu.Context, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = ctx.setup(model, optimizer)
    ckpt = ctx.checkpointer(tmp_path, model=model, optimizer=optimizer)
    _train(ctx, model, optimizer)
    ckpt.save()
    _train(ctx, model, optimizer)
    ckpt.save()
    ckpt.close()
    (tmp_path / ".tmp-step-00000000.2-deadbeef").mkdir()  # a save killed before its rename
    with caplog.at_level(logging.WARNING):
        assert find_latest(tmp_path).path.name == "step-00000000.1"  # type: ignore[union-attr]
    assert ".tmp-step-00000000.2-deadbeef" in caplog.text

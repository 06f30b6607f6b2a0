"""A directory holding only unfinished checkpoints: one warning, the dead run's temp dirs removed.

Single process (world size 1 needs no process group). Before, resume() said nothing above INFO
("no checkpoint ... starting from step 0") and the temp dirs stayed until a save removed them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import multigpu
from multigpu.checkpoint.native.layout import COMMIT_FILE, STATE_FILE
from multigpu.checkpoint.native.writer import LIVE_TEMP_DIRS, remove_stale


@pytest.fixture
def ctx() -> Iterator[multigpu.Context]:
    with multigpu.init(seed=0, accelerator="cpu", environ={}) as context:
        yield context


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_only_unfinished_checkpoints_are_said_in_one_warning_and_the_temp_dirs_removed(
    tmp_path: Path, ctx: multigpu.Context, caplog: pytest.LogCaptureFixture
) -> None:
    model = torch.nn.Linear(3, 2)
    ctx.checkpointer(tmp_path / "x", model=model).save()  # a real one, then its marker lost
    (tmp_path / "x" / "step-00000000").rename(tmp_path / "step-00000300")
    (tmp_path / "step-00000300" / COMMIT_FILE).unlink()
    for name in (".tmp-step-00000100-dead", ".tmp-step-00000200-beef"):
        (tmp_path / name).mkdir()
        (tmp_path / name / STATE_FILE).write_bytes(b"half")
    caplog.set_level(logging.INFO)
    ckpt = ctx.checkpointer(tmp_path, model=model)
    assert ckpt.resume() is None
    (line,) = _warnings(caplog)
    assert line.startswith(f"checkpoint directory {tmp_path} holds 3 incomplete checkpoint(s): ")
    assert "step-00000300 (no COMMITTED marker (the save was interrupted))" in line
    assert ".tmp-step-00000100-dead (no COMMITTED marker: a save that did not finish)" in line
    assert ".tmp-step-00000200-beef" in line and "\n" not in line
    assert "; nothing is complete; training starts from the beginning (step 0)" in line
    assert "the 2 unfinished save(s) of a run that is gone were removed" in line
    # The dead run's temp dirs can never be completed: gone; the named step dir is left to look at.
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != ".multigpu.lock") == [
        "step-00000300",
        "x",
    ]
    ckpt.close()


def test_a_complete_checkpoint_is_chosen_and_newer_temp_dirs_are_removed_with_a_warning(
    tmp_path: Path, ctx: multigpu.Context, caplog: pytest.LogCaptureFixture
) -> None:
    model = torch.nn.Linear(3, 2)
    ckpt = ctx.checkpointer(tmp_path, every_steps=1, model=model)
    ckpt.step()
    (tmp_path / ".tmp-step-00000002-dead").mkdir()
    caplog.set_level(logging.WARNING)
    assert ctx.checkpointer(tmp_path, model=model).resume() == 1
    said = " ".join(_warnings(caplog))
    assert ".tmp-step-00000002-dead: a save of step 2 that did not finish" in said
    assert "using the previous complete checkpoint" in said
    assert not (tmp_path / ".tmp-step-00000002-dead").exists()


def test_a_temp_dir_this_process_writes_is_never_stale(tmp_path: Path) -> None:
    live, dead = tmp_path / ".tmp-step-00000002-live", tmp_path / ".tmp-step-00000001-dead"
    live.mkdir(), dead.mkdir()
    LIVE_TEMP_DIRS.add(live)
    try:
        assert remove_stale(tmp_path, ".tmp-step-*") == [dead]
        assert live.is_dir() and not dead.exists()
    finally:
        LIVE_TEMP_DIRS.discard(live)

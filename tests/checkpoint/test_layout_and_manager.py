"""Checkpoint files on disk: what a broken checkpoint looks like, and that resume skips it.

Single process (world size 1 needs no process group): each case builds real checkpoints with
the Checkpointer, breaks the newest one the way a crash or a bad disk would, and checks that
``find_latest`` / ``resume`` name it in a warning and fall back to the previous complete one.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

import multigpu
from multigpu.checkpoint.native.layout import (
    COMMIT_FILE,
    MANIFEST_FILE,
    STATE_FILE,
    find_latest,
    list_checkpoints,
    verify_checkpoint,
)
from multigpu.checkpoint.native.sharded import METADATA_FILE, read_whole


@pytest.fixture
def ctx() -> Iterator[multigpu.Context]:
    with multigpu.init(seed=0, accelerator="cpu", environ={}) as context:
        yield context


def _steps(ckpt: multigpu.Checkpointer, model: torch.nn.Module, n: int) -> None:
    for _ in range(n):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        ckpt.step()


def _truncate(d: Path) -> str:
    data = (d / STATE_FILE).read_bytes()
    (d / STATE_FILE).write_bytes(data[: len(data) // 2])
    return "truncated"


def _flip(d: Path) -> str:
    path = d / "rank-00000.pt"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return "corrupt"


def _flip_shard(d: Path) -> str:
    path = d / "__0_0.distcp"  # the model's tensors, written by DCP
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return "__0_0.distcp: SHA-256 differs"


def _no_manifest(d: Path) -> str:
    (d / MANIFEST_FILE).unlink()
    return "manifest.json missing"


def _no_marker(d: Path) -> str:
    (d / COMMIT_FILE).unlink()
    return "no COMMITTED marker"


@pytest.mark.parametrize("damage", [_truncate, _flip, _flip_shard, _no_manifest, _no_marker])
def test_a_broken_newest_checkpoint_is_skipped_with_a_warning(
    tmp_path: Path,
    ctx: multigpu.Context,
    caplog: pytest.LogCaptureFixture,
    damage: Callable[[Path], str],
) -> None:
    model = torch.nn.Linear(3, 2)
    ckpt = ctx.checkpointer(tmp_path, every_steps=2, model=model)
    _steps(ckpt, model, 4)  # checkpoints at steps 2 and 4
    expected = read_whole(tmp_path / "step-00000002")["model"]
    what = damage(tmp_path / "step-00000004")
    assert not verify_checkpoint(tmp_path / "step-00000004").complete
    caplog.set_level(logging.WARNING)
    fresh = torch.nn.Linear(3, 2)
    assert ctx.checkpointer(tmp_path, model=fresh).resume() == 2
    assert torch.equal(fresh.weight, expected["weight"])
    warning = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "step-00000004" in warning and what in warning


def test_a_leftover_temp_dir_is_skipped_with_a_warning_and_cleaned_by_the_next_save(
    tmp_path: Path, ctx: multigpu.Context, caplog: pytest.LogCaptureFixture
) -> None:
    model = torch.nn.Linear(3, 2)
    ckpt = ctx.checkpointer(tmp_path, every_steps=1, model=model)
    _steps(ckpt, model, 1)
    stale = tmp_path / ".tmp-step-00000002-dead"
    stale.mkdir()
    (stale / STATE_FILE).write_bytes(b"half")
    caplog.set_level(logging.WARNING)
    status = find_latest(tmp_path)
    assert status is not None and status.step == 1
    warning = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert ".tmp-step-00000002-dead" in warning and "did not finish" in warning
    assert "using the previous complete checkpoint" in warning
    _steps(ckpt, model, 1)
    assert not stale.exists()
    assert [s.step for s in list_checkpoints(tmp_path)] == [1, 2]


def test_keep_prunes_older_checkpoints(tmp_path: Path, ctx: multigpu.Context) -> None:
    model = torch.nn.Linear(3, 2)
    ckpt = ctx.checkpointer(tmp_path, every_steps=1, keep=2, model=model)
    _steps(ckpt, model, 5)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".multigpu.lock",  # held while the checkpointer is open
        "step-00000004",
        "step-00000005",
    ]
    ckpt.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000004", "step-00000005"]


def test_the_manifest_describes_the_checkpoint(tmp_path: Path, ctx: multigpu.Context) -> None:
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    path = ctx.checkpointer(tmp_path, model=model, optimizer=opt).save()
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    assert manifest["format"] == "multigpu-checkpoint" and manifest["world_size"] == 1
    assert manifest["version"] == 2 and manifest["strategy"] == {"strategy": "single"}
    assert manifest["objects"] == {
        "model": {"kind": "module", "storage": "dcp"},
        "optimizer": {"kind": "optimizer", "storage": "dcp", "has_state": False},
    }
    assert set(manifest["files"]) == {STATE_FILE, "rank-00000.pt", METADATA_FILE, "__0_0.distcp"}
    assert manifest["torch_version"] == torch.__version__
    whole = read_whole(path)  # portable: plain CPU tensors, no model needed
    assert list(whole["model"]) == ["weight", "bias"]
    assert whole["optimizer"]["param_groups"][0]["params"] == ["weight", "bias"]


def test_resume_of_an_incomplete_path_and_bad_objects_are_errors(
    tmp_path: Path, ctx: multigpu.Context
) -> None:
    model = torch.nn.Linear(3, 2)
    path = ctx.checkpointer(tmp_path, model=model).save()
    shutil.copytree(path, tmp_path / "step-00000009")
    (tmp_path / "step-00000009" / COMMIT_FILE).unlink()
    with pytest.raises(multigpu.CheckpointError, match="step-00000009 is not usable"):
        ctx.checkpointer(tmp_path, model=model).resume(tmp_path / "step-00000009")
    with pytest.raises(multigpu.UsageError, match="has no state_dict"):
        ctx.checkpointer(tmp_path, model=model, numbers=[1, 2])
    with pytest.raises(multigpu.CheckpointError, match="does not fit"):
        ctx.checkpointer(tmp_path, model=torch.nn.Linear(4, 2)).resume(path)
    with pytest.raises(multigpu.UsageError, match="every_steps=0"):
        ctx.checkpointer(tmp_path, every_steps=0, model=model)


def test_an_async_save_writes_the_state_as_it_was_when_save_returned(
    tmp_path: Path, ctx: multigpu.Context
) -> None:
    model = torch.nn.Linear(256, 256)
    before = model.weight.detach().clone()
    ckpt = ctx.checkpointer(tmp_path, async_save=True, model=model)
    path = ckpt.save()
    with torch.no_grad():
        model.weight.add_(1.0)  # training goes on while the thread writes
    ckpt.wait()
    assert verify_checkpoint(path).complete
    assert torch.equal(read_whole(path)["model"]["weight"], before)


def test_save_on_sigterm_restores_the_previous_handler(
    tmp_path: Path, ctx: multigpu.Context
) -> None:
    import signal

    previous = signal.getsignal(signal.SIGTERM)
    ckpt = ctx.checkpointer(tmp_path, save_on_sigterm=True, model=torch.nn.Linear(1, 1))
    assert signal.getsignal(signal.SIGTERM) is not previous
    ckpt.close()
    assert signal.getsignal(signal.SIGTERM) == previous

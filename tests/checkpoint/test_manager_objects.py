"""What the Checkpointer tracks and when it writes: the scaler, names, extra objects, async timing.

Single process (world size 1 needs no process group); the multi-process behaviour is in
``test_resume_processes.py`` and ``test_preemption.py``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import multigpu
from multigpu.checkpoint.native import saving
from multigpu.checkpoint.native.layout import step_dir_name, verify_checkpoint
from multigpu.checkpoint.native.sharded import read_whole


@pytest.fixture
def ctx() -> Iterator[multigpu.Context]:
    with multigpu.init(seed=0, accelerator="cpu", environ={}) as context:
        yield context


def test_the_grad_scaler_of_16_mixed_is_tracked_and_restored(tmp_path: Path) -> None:
    with multigpu.init(precision="16-mixed", accelerator="cpu", environ={}) as ctx:
        scaler = ctx.precision.scaler
        assert scaler is not None
        net = torch.nn.Linear(2, 2)
        model, opt = ctx.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        ckpt = ctx.checkpointer(tmp_path, model=model, optimizer=opt)
        ctx.backward(model(torch.ones(1, 2)).sum())
        ctx.step(opt)
        scaler.update(1024.0)  # as after some steps with inf/NaN gradients
        path = ckpt.save()
        saved = verify_checkpoint(path).manifest["objects"]["grad_scaler"]  # type: ignore[index]
        assert saved == {"kind": "scaler", "storage": "state"}
        scaler.update(2.0)
        assert ctx.checkpointer(tmp_path, model=model, optimizer=opt).resume() == 0
        assert scaler.get_scale() == 1024.0


def test_a_name_taken_twice_is_a_usage_error(tmp_path: Path, ctx: multigpu.Context) -> None:
    ckpt = ctx.checkpointer(tmp_path, model=torch.nn.Linear(1, 1))
    with pytest.raises(multigpu.UsageError, match="'model' is already tracked"):
        ckpt.track(model=torch.nn.Linear(1, 1))


def test_objects_the_run_does_not_track_are_named_in_one_warning(
    tmp_path: Path, ctx: multigpu.Context, caplog: pytest.LogCaptureFixture
) -> None:
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    ctx.checkpointer(tmp_path, model=model, optimizer=opt, scheduler=sched).save()
    caplog.set_level(logging.WARNING)
    assert ctx.checkpointer(tmp_path, model=model).resume() == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "['optimizer', 'scheduler']" in warnings[0]


def test_an_async_save_returns_before_its_files_are_written(
    tmp_path: Path, ctx: multigpu.Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Hold the background writer at its first file: save() must return all the same.
    gate = threading.Event()
    write = saving.write_torch_file

    def gated(path: Path, payload: Any) -> Any:
        assert gate.wait(timeout=60), "the test never opened the gate"
        return write(path, payload)

    monkeypatch.setattr(saving, "write_torch_file", gated)
    model = torch.nn.Linear(4, 4)
    ckpt = ctx.checkpointer(tmp_path, async_save=True, model=model)
    path = ckpt.save()
    assert path == tmp_path / step_dir_name(0) and not path.exists()
    assert ckpt.latest() is None
    gate.set()
    ckpt.wait()
    assert verify_checkpoint(path).complete and ckpt.latest() == path
    assert torch.equal(read_whole(path)["model"]["weight"], model.weight)


def test_an_error_in_the_background_save_is_raised_by_wait(
    tmp_path: Path, ctx: multigpu.Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(path: Path, payload: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(saving, "write_torch_file", broken)
    ckpt = ctx.checkpointer(tmp_path, async_save=True, model=torch.nn.Linear(1, 1))
    ckpt.save()
    with pytest.raises(multigpu.CheckpointError, match="No space left on device"):
        ckpt.wait()
    ckpt.wait()  # raised once, then cleared
    assert ckpt.latest() is None

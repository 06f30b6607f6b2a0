"""``ctx.save(path, state)`` / ``ctx.load(path, state)``: one checkpoint at a path of your own."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

import multigpu


def _trained(ctx: multigpu.Context) -> tuple[torch.nn.Module, torch.optim.Optimizer, object]:
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2)
    model, opt = ctx.setup(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    loader = ctx.loader(TensorDataset(torch.randn(16, 3)), batch_size=4)
    for (x,) in loader:
        ctx.backward(model(x).square().mean())
        ctx.step(opt)
        break
    return model, opt, loader


def test_save_then_load_fills_objects_and_values_and_returns_the_rest(tmp_path: Path) -> None:
    with multigpu.init(seed=0, accelerator="cpu", environ={}) as ctx:
        model, opt, loader = _trained(ctx)
        saved = ctx.save(
            tmp_path / "final",
            {"model": model, "optimizer": opt, "loader": loader, "epoch": 3, "note": "hi",
             "mask": torch.tensor([True, False])},
        )  # fmt: skip
        assert saved == tmp_path / "final" and not list(tmp_path.glob(".tmp-*"))
        net = torch.nn.Linear(3, 2)
        other, fresh = ctx.setup(net, torch.optim.SGD(net.parameters(), lr=0.5, momentum=0.9))
        state = {"model": other, "optimizer": fresh, "epoch": 0}
        rest = ctx.load(tmp_path / "final", state)
    assert state["epoch"] == 3
    assert set(rest) == {"loader", "note", "mask"} and rest["note"] == "hi"
    assert torch.equal(rest["mask"], torch.tensor([True, False]))
    assert rest["loader"]["cursor"] == 4
    for name, tensor in model.state_dict().items():
        assert torch.equal(other.state_dict()[name], tensor), name
    assert fresh.param_groups[0]["lr"] == 0.1  # hyperparameters restored too
    buffers = [fresh.state[p]["momentum_buffer"] for p in other.parameters()]
    assert all(
        torch.equal(b, opt.state[p]["momentum_buffer"])
        for b, p in zip(buffers, model.parameters(), strict=True)
    )


def test_bad_saves_and_loads_say_what_to_change(tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()
    with multigpu.init(seed=0, accelerator="cpu", environ={}) as ctx:
        model, opt, _ = _trained(ctx)
        with pytest.raises(multigpu.UsageError, match="exists and is not a multigpu checkpoint"):
            ctx.save(tmp_path / "notes", {"model": model})
        with pytest.raises(multigpu.UsageError, match="not identifiers"):
            ctx.save(tmp_path / "x", {"my model": model})
        ctx.save(tmp_path / "ck", {"model": model, "step": 7})
        ctx.save(tmp_path / "ck", {"model": model, "step": 8})  # an earlier one is replaced
        with pytest.raises(multigpu.CheckpointMismatchError, match=r"no entry \['optimizer'\]"):
            ctx.load(tmp_path / "ck", {"model": model, "optimizer": opt})
        with pytest.raises(multigpu.CheckpointMismatchError, match="pass the objects"):
            ctx.load(tmp_path / "ck", {"model": None})
        state = {"step": 0}
        ctx.load(tmp_path / "ck", state)
        assert state["step"] == 8
        with pytest.raises(multigpu.CheckpointError, match="not a checkpoint directory"):
            ctx.load(tmp_path / "missing", {"model": model})

"""Making an optimizer's state before a checkpoint is loaded into it (``strategies.state``): the
state torch's own zero step makes, without its hooks, its per-parameter zero gradients, or a
change to the parameters, their gradients or the learning rates (one process)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn, optim
from torch.distributed.checkpoint.state_dict import _init_optim_state

from multigpu.strategies import state

MAKERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "adam": lambda p: optim.Adam(p, lr=1e-3),
    "adam-foreach": lambda p: optim.Adam(p, lr=1e-3, foreach=True),
    "adam-fused": lambda p: optim.Adam(p, lr=1e-3, fused=True),
    "adam-amsgrad-decay": lambda p: optim.Adam(p, lr=1e-3, amsgrad=True, weight_decay=0.1),
    "adam-maximize": lambda p: optim.Adam(p, maximize=True, foreach=True, weight_decay=0.1),
    "adamw-tensor-lr": lambda p: optim.AdamW(p, lr=torch.tensor(1e-3)),
    "sgd-nesterov": lambda p: optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
    "sgd-momentum-foreach": lambda p: optim.SGD(p, lr=0.1, momentum=0.9, foreach=True),
    "sgd": lambda p: optim.SGD(p, lr=0.1),
    "rmsprop": lambda p: optim.RMSprop(p, momentum=0.5, centered=True),
    "adagrad": lambda p: optim.Adagrad(p),
    "adamax": lambda p: optim.Adamax(p),
    "nadam": lambda p: optim.NAdam(p),
    "radam": lambda p: optim.RAdam(p),
    "adadelta": lambda p: optim.Adadelta(p),
    "asgd": lambda p: optim.ASGD(p),
    "rprop": lambda p: optim.Rprop(p),
}


def _layout(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Each parameter's state: tensors by shape and dtype, other values as they are."""
    return [
        {
            k: (tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else v
            for k, v in optimizer.state[p].items()
        }
        for group in optimizer.param_groups
        for p in group["params"]
    ]


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3, bias=False))


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_the_state_is_torchs_and_nothing_else_changes(name: str) -> None:
    ours, theirs = _net(), _net()
    mine, torchs = MAKERS[name](ours.parameters()), MAKERS[name](theirs.parameters())
    hooks: list[str] = []
    mine.register_step_pre_hook(lambda *_: hooks.append("pre"))
    mine.register_step_post_hook(lambda *_: hooks.append("post"))
    before = [p.detach().clone() for p in ours.parameters()]
    lrs = [g["lr"] for g in mine.param_groups]
    _init_optim_state(torchs)
    state.initialise_optimizer_state(mine)
    assert _layout(mine) == _layout(torchs)
    assert hooks == []  # making the state is not a training step
    assert all(torch.equal(a, b) for a, b in zip(before, ours.parameters(), strict=True))
    assert all(p.grad is None for p in ours.parameters())
    assert [g["lr"] for g in mine.param_groups] == lrs
    assert all(g["lr"] is lr for g, lr in zip(mine.param_groups, lrs, strict=True))


def test_the_zero_gradients_are_views_of_one_buffer_as_large_as_the_largest_parameter() -> None:
    seen: list[tuple[int, int]] = []

    class Recording(optim.SGD):
        def step(self, closure: Any = None) -> Any:  # type: ignore[override]
            for group in self.param_groups:
                for p in group["params"]:
                    seen.append((p.grad.untyped_storage().data_ptr(), p.grad.numel()))
            return super().step(closure)

    net = _net()
    state.initialise_optimizer_state(Recording(net.parameters(), lr=0.1, momentum=0.9))
    assert len(seen) == 3 and len({ptr for ptr, _ in seen}) == 1
    largest = max(p.numel() for p in net.parameters())
    assert max(n for _, n in seen) == largest


def test_gradients_already_there_are_kept_and_the_state_is_made_anyway() -> None:
    """torch's own makes no state when a gradient exists: a resume after a backward would then
    load none of the saved state."""
    net = _net()
    net(torch.ones(2, 5)).sum().backward()
    grads = [p.grad for p in net.parameters()]
    kept = [g.clone() for g in grads]  # type: ignore[union-attr]
    optimizer = optim.Adam(net.parameters())
    state.initialise_optimizer_state(optimizer)
    assert len(optimizer.state) == 3
    assert all(p.grad is g for p, g in zip(net.parameters(), grads, strict=True))
    assert all(torch.equal(p.grad, k) for p, k in zip(net.parameters(), kept, strict=True))
    other = copy.deepcopy(net)
    for a, b in zip(net.parameters(), other.parameters(), strict=True):
        b.grad = a.grad.clone()  # type: ignore[union-attr]
    torchs = optim.Adam(other.parameters())
    _init_optim_state(torchs)
    assert not torchs.state


def test_an_optimizer_with_state_is_left_alone_and_a_stateless_one_gives_no_state() -> None:
    net = _net()
    optimizer = optim.Adam(net.parameters())
    net(torch.ones(2, 5)).sum().backward()
    optimizer.step()
    exp_avg = optimizer.state[net[0].weight]["exp_avg"]
    state.initialise_optimizer_state(optimizer)
    assert optimizer.state[net[0].weight]["exp_avg"] is exp_avg
    other = _net()
    plain = optim.SGD(other.parameters(), lr=0.1)
    saved = state.optimizer_state(other, plain, initialise=True)
    assert saved["state"] == {} and saved["param_groups"][0]["params"] == [
        "0.weight",
        "0.bias",
        "2.weight",
    ]


@pytest.fixture
def group() -> Iterator[None]:
    """A one-rank gloo group with an in-memory store (FSDP2 needs a group even alone)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_fsdp_parameters_get_their_state_as_dtensors_laid_out_as_torchs(group: None) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from multigpu import torch_compat

    mesh = init_device_mesh("cpu", (1,))
    nets = [_net(), _net()]
    for net in nets:
        torch_compat.fully_shard(net[0], mesh=mesh)
        torch_compat.fully_shard(net, mesh=mesh)
    mine, torchs = (optim.AdamW(n.parameters(), lr=1e-3) for n in nets)
    before = [p.full_tensor().clone() for p in nets[0].parameters()]
    _init_optim_state(torchs)
    state.initialise_optimizer_state(mine)
    for ours, theirs in zip(nets[0].parameters(), nets[1].parameters(), strict=True):
        a, b = mine.state[ours]["exp_avg"], torchs.state[theirs]["exp_avg"]
        assert torch_compat.is_dtensor(a) and a.placements == b.placements
        assert a.shape == b.shape and a.to_local().shape == b.to_local().shape
    assert all(
        torch.equal(a, b.full_tensor()) for a, b in zip(before, nets[0].parameters(), strict=True)
    )
    assert all(p.grad is None for p in nets[0].parameters())

"""Mixed precision and the step controls in one process (no process group needed)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import multigpu
from multigpu.runtime.precision import parse_precision

PLAIN = {"MULTIGPU_DEVICE": "cpu"}  # a plain single process, on the CPU on any machine


def data(n: int = 256) -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 16, generator=gen)
    return TensorDataset(x, (x[:, 0] > 0).long())


def test_bf16_mixed_runs_the_forward_in_bfloat16_and_returns_float32():
    with multigpu.init(precision="bf16-mixed", environ=PLAIN) as ctx:
        net = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 2))
        seen: list[torch.dtype] = []
        net[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
        model, opt = ctx.setup(net, torch.optim.SGD(net.parameters(), lr=0.5))
        first = last = None
        for _ in range(3):
            for x, y in ctx.loader(data(), batch_size=64):
                out = model(x)
                loss = F.cross_entropy(out, y)
                first = first if first is not None else loss.item()
                last = loss.item()
                ctx.backward(loss)
                ctx.step(opt)
        assert out.dtype == torch.float32 and seen[0] == torch.bfloat16
        assert net[0].weight.dtype == torch.float32  # master weights stay float32
        assert ctx.unwrap(model) is net and next(iter(net.state_dict())) == "0.weight"
        assert last < first


def test_16_mixed_scales_the_loss_and_steps_through_the_scaler():
    with multigpu.init(precision="16-mixed", environ=PLAIN) as ctx:
        net = nn.Linear(16, 2)
        model, opt = ctx.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        scaler = ctx.precision.scaler
        assert scaler is not None and scaler.get_scale() == 2.0**16
        x, y = data(64)[:]
        loss = F.cross_entropy(model(x), y)
        ctx.backward(loss)
        scaled = net.weight.grad.clone()
        norm = ctx.clip_grad_norm(model, opt, max_norm=1e9)  # unscales first
        assert norm is not None
        assert torch.allclose(net.weight.grad * 2.0**16, scaled, rtol=1e-3)
        before = net.weight.detach().clone()
        assert ctx.step(opt) is True
        assert not torch.equal(before, net.weight) and net.weight.grad is None


def test_precision_names():
    assert parse_precision("16") == "16-mixed" and parse_precision(32) == "32"
    with pytest.raises(multigpu.UsageError, match="precision='8-mixed' is not known"):
        multigpu.init(precision="8-mixed", environ=PLAIN)


def test_accumulate_steps_only_at_the_end_of_each_step_and_scales_the_loss():
    with multigpu.init(environ=PLAIN) as ctx:
        net = nn.Linear(16, 2, bias=False)
        model, opt = ctx.setup(net, torch.optim.SGD(net.parameters(), lr=0.0))
        loader = ctx.loader(data(), batch_size=64, accumulation_steps=4)
        assert loader.batch_size == 16
        stepped = []
        grads = []
        for i, (x, y) in enumerate(loader):
            with ctx.accumulate(model):
                ctx.backward(F.cross_entropy(model(x), y))
                if i % 4 == 3:
                    grads.append(net.weight.grad.clone())
                stepped.append(ctx.step(opt))
        assert stepped == [False, False, False, True] * 4
        # The accumulated gradient equals the full-batch gradient of the same 64 samples.
        order = loader.sampler.global_order(0)[:64]
        x, y = data()[order]
        net.weight.grad = None
        F.cross_entropy(net(x), y).backward()
        assert torch.allclose(grads[0], net.weight.grad, atol=1e-6)


def test_step_after_the_accumulate_block_skips_the_same_micro_batches():
    """``with ctx.accumulate(model): backward`` and then ``ctx.step(opt)`` after the block:
    it stepped at every micro-batch, whose gradients DDP had not all-reduced (2 processes
    diverged: final weights summing to 0.040 against 1 process's -0.180)."""
    with multigpu.init(environ=PLAIN) as ctx:
        net = nn.Linear(16, 2, bias=False)
        model, opt = ctx.setup(net, torch.optim.SGD(net.parameters(), lr=0.0))
        loader = ctx.loader(data(), batch_size=64, accumulation_steps=4)
        stepped = []
        for x, y in loader:
            with ctx.accumulate(model):
                ctx.backward(F.cross_entropy(model(x), y))
            stepped.append(ctx.step(opt))
        assert stepped == [False, False, False, True] * 4


def test_accumulate_sync_override_and_warning_outside_accumulate(caplog):
    with multigpu.init(environ=PLAIN) as ctx:
        net = nn.Linear(16, 2)
        model, opt = ctx.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        with ctx.accumulate(model, sync=False):
            assert ctx.sync_step is False and ctx.step(opt) is False
        assert ctx.sync_step is False and ctx.step(opt) is False  # until the next batch
        x, y = next(iter(ctx.loader(data(), batch_size=64, accumulation_steps=2)))
        assert ctx.sync_step is True
        with caplog.at_level("WARNING"):
            ctx.backward(F.cross_entropy(model(x), y))
        assert "outside ctx.accumulate" in caplog.text


def test_deterministic_mode_switch():
    try:
        with multigpu.init(deterministic=True, environ=PLAIN):
            assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)

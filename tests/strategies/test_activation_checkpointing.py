"""Activation checkpointing policies: the same gradients as none, what each keeps, and what is
refused (one process: no collective is involved in what a block saves)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import multigpu
from multigpu.errors import UsageError
from multigpu.examples import lm
from multigpu.strategies.activation_checkpointing import (
    ActivationCheckpointing,
    checkpoint_block,
    checkpointing_of,
)
from multigpu.strategies.compose import block_units, compose

SHAPE = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16}


class TinyBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(4, 8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)))


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    seq = torch.randint(0, 256, (4, 17), generator=g)
    return seq[:, :-1], seq[:, 1:]


def _model(policy: object, backend: str | None = None) -> nn.Module:
    torch.manual_seed(0)
    model = lm.build_model(**SHAPE)
    checkpointing = ActivationCheckpointing.parse(policy, owner="test")
    compose(model, block_units(model), checkpointing=checkpointing, backend=backend)
    return model


def _grads(model: nn.Module) -> tuple[dict[str, torch.Tensor], int]:
    """The gradients of one batch, and how many tensors the forward saved for the backward."""
    saved = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += 1
        return tensor

    x, y = _batch()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return grads, saved


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(((a[k] - b[k]).abs().max() / (b[k].abs().max() + 1e-12)).item() for k in b)


def test_each_policy_gives_the_gradients_of_none():
    none, _ = _grads(_model(False))
    for policy in ("full", "selective"):
        assert _close(_grads(_model(policy))[0], none) <= 1e-6, policy


def test_compiled_selective_keeps_fewer_tensors_than_none_and_more_than_full():
    """Counted under compile (aot_eager), where a block's saved activations are the compiled
    function's own saved tensors (eager selective keeps its tensors in the checkpoint's cache,
    out of ``saved_tensors_hooks``' sight)."""
    torch._dynamo.reset()  # a fresh cache: each compile here is a compile, not a cache limit hit
    none, kept_none = _grads(_model(False, backend="aot_eager"))
    full, kept_full = _grads(_model("full", backend="aot_eager"))
    selective, kept_selective = _grads(_model("selective", backend="aot_eager"))
    assert _close(full, none) <= 1e-5 and _close(selective, none) <= 1e-5
    assert kept_none > kept_selective > kept_full, (kept_none, kept_selective, kept_full)


def test_a_memory_budget_under_compile_gives_the_gradients_of_none_and_keeps_less():
    none, _ = _grads(_model(False))
    _, kept = _grads(_model(False, backend="aot_eager"))
    budget, kept_in_budget = _grads(_model(0.1, backend="aot_eager"))  # after: not a cache hit
    assert _close(budget, none) <= 1e-5
    assert kept_in_budget < kept


def test_checkpointing_keeps_the_block_its_parameters_and_names_and_one_class_per_kind():
    model = lm.build_model(**SHAPE)
    names = [n for n, _ in model.named_parameters()]
    blocks = list(model.blocks)
    for block in blocks:
        checkpoint_block(block, ActivationCheckpointing.parse("selective", owner="test"))
    assert list(model.blocks) == blocks and [n for n, _ in model.named_parameters()] == names
    assert type(blocks[0]) is type(blocks[1]) and isinstance(blocks[0], lm.Block)
    assert checkpointing_of(blocks[0]) == "selective" and checkpointing_of(model) is None
    assert type(copy.deepcopy(model).blocks[0]).__name__ == "CheckpointedBlock"


@pytest.mark.parametrize("value", ["fancy", 1.0, 0.0, 1, "0.5", float("nan")])
def test_a_bad_policy_is_one_line_naming_the_value_and_the_choices(value: object):
    for strategy in (multigpu.FSDPStrategy, multigpu.DDPStrategy):
        with pytest.raises(UsageError) as info:
            strategy(activation_checkpointing=value)
        message = str(info.value)
        assert "\n" not in message
        assert message.startswith(f"{strategy.__name__}(activation_checkpointing={value!r})")
        assert "'selective'" in message and "memory budget in (0, 1)" in message


def test_a_memory_budget_without_compile_is_refused_before_anything_starts():
    strategy = multigpu.FSDPStrategy(activation_checkpointing=0.5)
    with pytest.raises(UsageError, match=r"^FSDPStrategy\(activation_checkpointing=0.5\) is a "):
        multigpu.init(strategy, environ={})
    with multigpu.init(strategy, environ={}, compile="aot_eager") as ctx:
        assert ctx.strategy.describe()["activation_checkpointing"] == "budget 0.5"


def test_strategies_that_compile_nothing_refuse_compile_and_a_bad_backend_is_one_line():
    with pytest.raises(UsageError, match=r"^compile='aot_eager' with strategy='dp'"):
        multigpu.init("dp", compile="aot_eager", environ={})
    with pytest.raises(UsageError, match=r"^compile='aot-eager': expected True \(inductor\)"):
        multigpu.init("single", compile="aot-eager", environ={})


def test_inductor_compiles_each_block_once_and_says_so(capsys: pytest.CaptureFixture[str]):
    """The one inductor test (seconds with inductor's cache warm, ~40 s cold on 2 busy cores):
    a model of two tiny blocks."""
    torch._dynamo.reset()  # one compile cache per code object: earlier tests' entries out
    torch.manual_seed(0)
    net = nn.Sequential(TinyBlock(), TinyBlock())
    eager = copy.deepcopy(net)
    x = torch.randn(2, 4)
    with multigpu.init("single", compile=True, environ={}) as ctx:
        model, opt = ctx.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        ctx.backward(model(x).square().sum())
        ctx.step(opt)
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    eager(x).square().sum().backward()
    eager_opt.step()
    for got, want in zip(net.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    out = capsys.readouterr().out.splitlines()
    assert any(
        line.startswith("torch.compile: compiled 2 blocks in ")
        and line.endswith("(TinyBlock; backend inductor)")
        for line in out
    ), out
    assert "torch.compile: no graph breaks" in out


def test_tensor_parallel_refuses_the_checkpointing_torch_cannot_compile_there():
    for policy in ("full", 0.5):
        strategy = multigpu.TensorParallelStrategy({"l": object()}, tensor_parallel=1)
        strategy.checkpointing = ActivationCheckpointing.parse(
            policy, owner="TensorParallelStrategy"
        )
        with pytest.raises(UsageError, match=r"torch's compiler fails on a tensor-parallel"):
            strategy.bind(torch.device("cpu"), 1, compile="aot_eager")
    eager = multigpu.TensorParallelStrategy(
        {"l": object()}, tensor_parallel=1, activation_checkpointing="full"
    )
    eager.bind(torch.device("cpu"), 1)  # eager: full checkpointing is fine

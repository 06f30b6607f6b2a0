"""Canaries of ``multigpu.torch_compat.compile``: torch.compile's private counters and the
partitioner's memory budget. Each fails when a torch release moves or changes what it reads."""

from __future__ import annotations

import torch
import torch._dynamo
from torch import nn

from multigpu import torch_compat


def _saved_tensors(fn: object, x: torch.Tensor) -> int:
    """How many tensors the forward of ``fn(x)`` keeps for its backward."""
    count = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal count
        count += 1
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(x)  # type: ignore[operator]
    out.sum().backward()
    return count


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    layers = (nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 8))
    return nn.Sequential(*layers)


def test_compile_seconds_grow_with_a_compile_and_graph_breaks_are_counted_by_reason() -> None:
    before_s, before = torch_compat.compile_seconds(), torch_compat.graph_breaks()

    def broken(x: torch.Tensor) -> torch.Tensor:
        y = x.sin()
        torch._dynamo.graph_break()  # the documented way to ask for one
        return y.cos()

    torch.compile(broken, backend="aot_eager")(torch.randn(3, requires_grad=True)).sum().backward()
    assert torch_compat.compile_seconds() > before_s
    after = torch_compat.graph_breaks()
    grown = {reason: n - before.get(reason, 0) for reason, n in after.items()}
    assert sum(grown.values()) >= 1 and all(isinstance(r, str) for r in grown)


def test_the_memory_budget_is_set_for_a_block_and_the_partitioner_keeps_less_under_it() -> None:
    assert torch_compat.current_memory_budget() == 1.0
    with torch_compat.activation_memory_budget(0.05):
        assert torch_compat.current_memory_budget() == 0.05
    assert torch_compat.current_memory_budget() == 1.0
    x = torch.randn(16, 8, requires_grad=True)
    kept = _saved_tensors(torch.compile(_mlp(), backend="aot_eager"), x)
    within = torch_compat.backend_with_memory_budget("aot_eager", 0.05)
    assert torch_compat.backend_with_memory_budget("aot_eager", 0.05) is within  # one object
    small = _saved_tensors(torch.compile(_mlp(), backend=within), x)  # compiled again, not reused
    assert torch_compat.current_memory_budget() == 1.0  # set only while the backend compiled
    assert small < kept


_SHIFT = 0


def _shifted_sin(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return x.sin() + _SHIFT  # guarded on the global's value


def test_a_frame_past_the_recompile_limit_counts_as_a_graph_break() -> None:
    torch._dynamo.reset()
    before = torch_compat.graph_breaks()
    global _SHIFT
    for _SHIFT in range(torch._dynamo.config.recompile_limit + 1):  # each value: a recompile
        block = type(f"Block{_SHIFT}", (nn.Module,), {"forward": _shifted_sin})()
        block.compile(backend="eager")
        block(torch.randn(2))
    grown = {r: n for r, n in torch_compat.graph_breaks().items() if n > before.get(r, 0)}
    torch._dynamo.reset()
    assert any("recompile limit" in reason.lower() for reason in grown), grown

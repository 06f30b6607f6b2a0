"""Worker of test_collective_coverage (module level: spawned children import it).

Every public function of ``torch.distributed`` is replaced, before any Context, by a recorder of
its calls (the tap then wraps the recorder): what each strategy and multigpu's own tools call,
through the module the tap wraps, is what the recorder saw (but ``NOT_TAPPED``'s, which
``P2POp`` accepts only unwrapped).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import multigpu
from multigpu.instruments.hang.install import active_log
from multigpu.runtime import collective_taps
from multigpu.runtime.collective_taps import NOT_TAPPED
from multigpu.runtime.seed import seed_everything

BATCH = 8
KINDS = ("ddp", "fsdp", "pipeline", "tensor_parallel")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(2))
        self.ff = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.inp(x))
        for block in self.blocks:
            x = block(x)
        return self.head(x + self.ff(x))


def _strategy(kind: str) -> Any:
    if kind == "pipeline":
        return multigpu.PipelineStrategy(
            example_input=torch.zeros(BATCH, 8), split_points=["blocks.1"], microbatches=2
        )
    if kind == "tensor_parallel":
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        plan = {"ff.0": ColwiseParallel(), "ff.2": RowwiseParallel()}
        return multigpu.TensorParallelStrategy(plan, tensor_parallel=2, min_block_params=1)
    if kind == "fsdp":
        return multigpu.FSDPStrategy(min_block_params=1)
    return kind


def _public_functions() -> list[str]:
    return [
        name
        for name in dir(tdist)
        if not name.startswith("_")
        and name not in NOT_TAPPED  # P2POp refuses any function but torch's own
        and callable(value := getattr(tdist, name))
        and not inspect.isclass(value)
        and not inspect.ismodule(value)
    ]


def _recording(calls: set[str], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        calls.add(name)
        return fn(*args, **kwargs)

    return recorded


def _train(kind: str, directory: Path) -> dict[str, Any]:
    data = TensorDataset(torch.randn(4 * BATCH, 8), torch.randn(4 * BATCH, 4))
    with multigpu.init(_strategy(kind), seed=0) as ctx:
        seed_everything(0)
        net = Net()
        model, opt = ctx.setup(net, torch.optim.SGD(net.parameters(), lr=0.01))
        loader = ctx.loader(data, batch_size=BATCH)
        ckpt = ctx.checkpointer(directory / kind, every_steps=2, model=model, optimizer=opt)
        ckpt.track(loader=loader)
        for x, y in loader:
            if kind == "pipeline":
                ctx.forward_backward(model, x, target=y, loss_fn=F.mse_loss)
            else:
                ctx.backward(F.mse_loss(model(x), y))
            ctx.clip_grad_norm(model, opt, 1.0)
            ctx.step(opt)
            ckpt.step()
        ckpt.close()
        ckpt.resume(directory / kind / "step-00000002")
        mean = multigpu.Mean()
        with torch.no_grad():
            for x, y in ctx.loader(data, batch_size=BATCH, shuffle=False):
                mean.update(F.mse_loss(model(x), y, reduction="none").mean(dim=1))
        mean.compute()
        ctx.throughput(across_ranks=True)
        ctx.full_state_dict(model)
        log = active_log()
        return {
            "listeners": sorted(type(x).__name__ for x in collective_taps.listeners()),
            "recorded": sorted({op for op, _ in log.site_counts}) if log is not None else [],
        }


def calls_of_each_strategy(directory: str) -> dict[str, dict[str, Any]]:
    """By strategy: the public ``torch.distributed`` functions its run called (``called``), the
    tap's listeners (by type) and the ops the hang explainer's log recorded, at its end."""
    calls: set[str] = set()
    originals = {name: getattr(tdist, name) for name in _public_functions()}
    for name, fn in originals.items():
        setattr(tdist, name, _recording(calls, name, fn))
    try:
        made: dict[str, dict[str, Any]] = {}
        for kind in KINDS:
            calls.clear()
            made[kind] = _train(kind, Path(directory))
            made[kind]["called"] = sorted(calls)
        return made
    finally:
        for name, fn in originals.items():
            setattr(tdist, name, fn)

"""Module-level worker functions for run_distributed (importable by spawned children)."""

from __future__ import annotations

import contextlib
import io
import warnings
from typing import Any

import torch
from torch import nn

import multigpu


def tiny_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def ddp_train(steps: int) -> dict[str, Any]:
    """Train a tiny model for ``steps`` DDP steps; return its parameters and what it saw."""
    with multigpu.init(seed=0) as ctx:
        # Different data per rank: DDP's averaged gradients must still keep the replicas equal.
        gen = torch.Generator().manual_seed(100 + ctx.rank)
        model = tiny_model()
        initial = {k: v.clone() for k, v in model.state_dict().items()}
        model, opt = ctx.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
        for _ in range(steps):
            x = torch.randn(16, 8, generator=gen)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            ctx.backward(loss)
            opt.step()
        plain = ctx.unwrap(model)
        return {
            "rank": ctx.rank,
            "world_size": ctx.world_size,
            "wrapper": type(model).__name__,
            "keys": sorted(plain.state_dict()),
            "params": {k: v.detach().clone() for k, v in plain.state_dict().items()},
            "initial": initial,
            "backend": ctx.backend,
        }


def collectives() -> dict[str, Any]:
    with multigpu.init() as ctx:
        r = ctx.rank
        out: dict[str, Any] = {}
        out["mean_number"] = ctx.all_reduce(float(r + 1))
        out["sum_int"] = ctx.all_reduce(r + 1, op="sum")
        out["max_tensor"] = ctx.all_reduce(torch.tensor([r, -r]), op="max")
        source = torch.tensor([1.0, 2.0])
        out["mean_tensor"] = ctx.all_reduce(source * (r + 1))
        out["source_untouched"] = source
        # Rank r contributes r + 1 rows: 1 + 2 = 3 rows in all, nothing padded reaches the caller.
        out["gathered"] = ctx.gather(torch.full((r + 1, 2), float(r)))
        out["gathered_obj"] = ctx.gather({"rank": r})
        out["broadcast"] = ctx.broadcast({"from": r}, src=1)
        ctx.barrier()
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            ctx.print("hello", r)
            ctx.print("everyone", all_ranks=True)
        out["printed"] = buf.getvalue()
        return out


def teardown_releases_group() -> dict[str, Any]:
    import torch.distributed as dist

    ctx = multigpu.init()
    net = tiny_model()
    model, _ = ctx.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    before = dist.is_initialized()
    ctx.teardown()
    ctx.teardown()  # idempotent
    return {
        "before": before,
        "after": dist.is_initialized(),
        "reducer_dropped": not hasattr(model, "reducer"),
    }


def strategy_name(strategy: str) -> str:
    with multigpu.init(strategy=strategy) as ctx:
        return ctx.strategy.name


def bn_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1)).double()


def bn_batches(steps: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    # Columns of different scales: per-rank statistics would differ from the global ones.
    return [torch.randn(16, 4, generator=gen, dtype=torch.float64) * 3 + 1 for _ in range(steps)]


def train_bn(model: nn.Module, batches: list[torch.Tensor], step: Any) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for x in batches:
        opt.zero_grad()
        step(model(x).pow(2).mean())
        opt.step()


def sync_batchnorm_train(steps: int) -> dict[str, Any]:
    """Each rank trains on its half of every global batch with sync_batchnorm=True."""
    with multigpu.init(seed=None, sync_batchnorm=True) as ctx:
        net = bn_model()
        model = ctx.setup(net)
        half = [x[ctx.rank * 8 : (ctx.rank + 1) * 8] for x in bn_batches(steps)]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            train_bn(model, half, ctx.backward)
        plain = ctx.unwrap(model)
        plain.eval()
        return {
            "bn_type": type(plain[1]).__name__,
            "future_warnings": [str(w.message) for w in caught if w.category is FutureWarning],
            "state": {k: v.clone() for k, v in plain.state_dict().items()},
            "eval_out": plain(bn_batches(1)[0]).detach(),
        }


def uneven_training_with_join() -> dict[str, Any]:
    """drop_last=False: 10 samples, global batch 4, 2 ranks → the last step gives rank 1 nothing."""
    from torch.utils.data import TensorDataset

    with multigpu.init(seed=0) as ctx:
        net = nn.Linear(3, 1)
        model, opt = ctx.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        data = TensorDataset(torch.randn(9, 3), torch.randn(9, 1))
        loader = ctx.loader(data, batch_size=4, drop_last=False)
        batches = 0
        with ctx.join(model):
            for x, y in loader:
                ctx.backward((model(x) - y).pow(2).mean())
                ctx.step(opt)
                batches += 1
        return {"batches": batches, "weight": net.weight.detach().clone()}

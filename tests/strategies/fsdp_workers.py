"""Module-level workers for the FSDP tests (run_distributed pickles them by name).

Each worker runs several configurations one after another in the same process group (a process
start costs ~4 s on 2 cores): every run reseeds and builds its own model, optimizer and loader,
so it is the same run as in a process of its own.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import multigpu
from multigpu.examples import lm
from multigpu.examples.digits import DigitsCNN
from multigpu.runtime.seed import seed_everything

SAMPLES = 416
BATCH = 32  # global


def _data(kind: str) -> TensorDataset:
    g = torch.Generator().manual_seed(7)
    if kind == "cnn":
        x = torch.randn(SAMPLES, 1, 8, 8, generator=g)
        y = torch.randint(0, 10, (SAMPLES,), generator=g)  # memorised: a smooth trajectory
        return TensorDataset(x, torch.arange(SAMPLES), y)
    seq = torch.randint(0, 256, (SAMPLES, 17), generator=g)
    seq[:, 1::2] = (seq[:, 0::2][:, : seq[:, 1::2].shape[1]] + 1) % 256  # something to learn
    return TensorDataset(seq[:, :-1], torch.arange(SAMPLES), seq[:, 1:])


LR = {"cnn": 0.02, "lm": 0.05}
"""SGD's learning rate per model. At 0.05 the CNN, memorising random labels, trains at the edge
of stability: on an AMD EPYC (AVX2) the ~1e-7 rounding difference between one batch of 32 and
two of 16 grew x700 in ten steps after step 70 (2.5e-2 max relative at step 100, under DDP as
under FSDP: chaos, not sharding). At 0.02 it stays at 3e-7 and the weights still move by 85 %."""


def build(kind: str) -> nn.Module:
    """The model of ``kind`` from the current RNG: "cnn" the digits CNN of ``multigpu train``,
    "lm" the GPT of ``multigpu train --model lm`` (2 blocks of ~200k parameters, context 16)."""
    return DigitsCNN() if kind == "cnn" else lm.build_model(n_layer=2, block_size=16)


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def train(
    ctx: Any, kind: str, steps: int, acc: int = 1, clip: float | None = None
) -> dict[str, Any]:
    """One SGD-with-momentum run of ``steps`` optimizer steps; the whole final state on rank 0."""
    seed_everything(0)
    net = build(kind)
    model, opt = ctx.setup(net, torch.optim.SGD(net.parameters(), lr=LR[kind], momentum=0.9))
    loader = ctx.loader(_data(kind), batch_size=BATCH, accumulation_steps=acc)
    norms: list[float] = []
    done = 0
    while done < steps:
        for x, _index, y in loader:
            with ctx.accumulate(model):
                ctx.backward(_loss(model(x), y))
                norm = ctx.clip_grad_norm(model, opt, clip) if clip is not None else None
                if ctx.step(opt):
                    done += 1
                    if norm is not None:
                        norms.append(float(norm))
            if done == steps:
                break
    return {
        "state": ctx.full_state_dict(model),
        "norms": norms,
        "describe": ctx.strategy.describe(),
    }


RUNS = [("cnn", 1, None), ("cnn", 2, None), ("lm", 1, 0.5), ("lm", 2, 0.5)]
"""(model, micro-steps, clip) of the equivalence test."""


def equivalence(strategy: str, steps: int) -> list[dict[str, Any]]:
    """Every run of RUNS under ``strategy`` in one process group."""
    with multigpu.init(strategy=strategy, seed=0) as ctx:
        return [train(ctx, kind, steps, acc, clip) for kind, acc, clip in RUNS]


def fsdp_then_ddp_norms(steps: int) -> dict[str, list[float]]:
    """Clipping norms of the same LM run under FSDP and under DDP, on this world size."""
    with multigpu.init(strategy="fsdp", seed=0) as fsdp:
        sharded = train(fsdp, "lm", steps, clip=0.5)["norms"]
        with multigpu.init(strategy="ddp", seed=0) as ddp:  # the same process group
            replicated = train(ddp, "lm", steps, clip=0.5)["norms"]
    return {"fsdp": sharded, "ddp": replicated}


def _initial(ctx: Any, meta: bool) -> dict[str, torch.Tensor]:
    """The whole LM right after ``ctx.setup``, built eagerly or in ``ctx.init_module()``."""
    seed_everything(3)
    if meta:
        with ctx.init_module():
            net = build("lm")
    else:
        net = build("lm")
    model = ctx.setup(net)
    draw = torch.rand(4)  # the generator goes on from where an eager build left it
    state = ctx.full_state_dict(model)
    if state:
        state["_next_draw"] = draw
    return state


def initial_weights(strategy: str, meta: bool) -> dict[str, torch.Tensor]:
    """``_initial`` in a context of its own (the GPU tests)."""
    with multigpu.init(strategy=strategy, seed=0) as ctx:
        return _initial(ctx, meta)


def _variants(steps: int) -> dict[str, dict[str, Any]]:
    """The LM under FSDP options that must not change the numbers (or only by rounding).

    Call it inside a context that owns the process group: these contexts reuse it.
    """
    out: dict[str, dict[str, Any]] = {}
    for label, strategy, precision in (
        ("default", multigpu.FSDPStrategy(), "32"),
        (
            "blocks+checkpointing",
            multigpu.FSDPStrategy(blocks=(lm.Block,), activation_checkpointing=True),
            "32",
        ),
        ("no reshard", multigpu.FSDPStrategy(reshard_after_forward=False), "32"),
        ("bf16-mixed", multigpu.FSDPStrategy(), "bf16-mixed"),
    ):
        with multigpu.init(strategy=strategy, precision=precision, seed=0) as ctx:
            out[label] = train(ctx, "lm", steps)
    return out


def one_process(steps: int) -> dict[str, Any]:
    """Everything the FSDP tests compare against, on one process without sharding."""
    with multigpu.init(strategy="single", seed=0) as ctx:
        out: dict[str, Any] = {"runs": [train(ctx, k, steps, a, c) for k, a, c in RUNS]}
        out["eager"] = _initial(ctx, meta=False)
        with multigpu.init(strategy="fsdp", seed=0) as fsdp:  # a one-rank group of its own
            out["meta"] = _initial(fsdp, meta=True)
    return out


def sharded_after_forward(ctx: Any) -> dict[str, bool]:
    """Whether each parameter of the LM is sharded (a DTensor) after a forward: the units
    resharded after their forward are, the kept ones hold their gathered weights."""
    from torch.distributed.tensor import DTensor

    seed_everything(0)
    net = build("lm")
    model, _ = ctx.setup(net, torch.optim.SGD(net.parameters(), lr=LR["lm"]))
    model(_data("lm").tensors[0][:2])
    return {name: isinstance(p, DTensor) for name, p in ctx.unwrap(model).named_parameters()}


def two_processes(steps: int, short: int) -> dict[str, Any]:
    """Everything the FSDP tests check on two processes, in one process group."""
    with multigpu.init(strategy="fsdp", seed=0) as fsdp:
        out: dict[str, Any] = {"runs": [train(fsdp, k, steps, a, c) for k, a, c in RUNS]}
        out["sharded_after_forward"] = sharded_after_forward(fsdp)
        out["meta"] = _initial(fsdp, meta=True)
        out["fsdp_norms"] = train(fsdp, "lm", short, clip=0.5)["norms"]
        with multigpu.init(strategy="ddp", seed=0) as ddp:
            out["ddp_norms"] = train(ddp, "lm", short, clip=0.5)["norms"]
        out["variants"] = _variants(short)
    return out


def build_state_zero(kind: str) -> dict[str, torch.Tensor]:
    """The initial weights every run of ``kind`` starts from."""
    seed_everything(0)
    return {k: v.detach().clone() for k, v in build(kind).state_dict().items()}

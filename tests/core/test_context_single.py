"""World size 1: no process group, same API, collectives are no-ops; device and strategy choice."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

import multigpu
from multigpu.runtime.device import backend_for, move_to_device
from multigpu.strategies import unwrap_module

PLAIN = {"MULTIGPU_DEVICE": "cpu"}  # a plain single process, on the CPU on any machine


def test_single_process_has_no_group_and_noop_collectives():
    with multigpu.init(environ=PLAIN) as ctx:
        assert (ctx.rank, ctx.local_rank, ctx.world_size, ctx.is_main) == (0, 0, 1, True)
        assert ctx.device == torch.device("cpu")
        assert ctx.strategy.name == "single"
        assert not dist.is_initialized()
        assert ctx.all_reduce(3) == 3.0
        assert ctx.all_reduce(3, op="sum") == 3
        t = torch.tensor([1.0, 2.0])
        assert torch.equal(ctx.all_reduce(t), t)
        assert ctx.gather("x") == ["x"]
        assert ctx.broadcast(5) == 5
        ctx.barrier()
        # ctx.reduce was an all-reduce (unlike torch's reduce): renamed, old callers told how
        with pytest.raises(multigpu.UsageError, match=r"use ctx.all_reduce\(value, op='sum'\)"):
            ctx.reduce(3)


def test_setup_returns_model_and_optimizers_and_unwrap_is_plain():
    with multigpu.init(environ=PLAIN) as ctx:
        net = nn.Linear(3, 2)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        model, opt2 = ctx.setup(net, opt)
        assert opt2 is opt and ctx.unwrap(model) is net
        assert ctx.setup(nn.Linear(1, 1)).__class__ is nn.Linear
        with pytest.raises(multigpu.UsageError, match="expected a torch.nn.Module"):
            ctx.setup("not a model")


def test_unwrap_strips_dataparallel_and_compile_prefixes():
    net = nn.Linear(2, 2)
    assert unwrap_module(nn.DataParallel(net)) is net
    compiled = torch.compile(net)  # wrapping only: nothing is compiled until it is called
    assert unwrap_module(compiled) is net
    assert list(unwrap_module(nn.DataParallel(compiled)).state_dict()) == ["weight", "bias"]


def test_dp_on_cpu_says_it_is_a_pass_through(caplog):
    with multigpu.init("dp", environ=PLAIN) as ctx, caplog.at_level("WARNING"):
        net = nn.Linear(2, 2)
        assert ctx.setup(net) is net
    assert "pass-through" in caplog.text


@pytest.mark.parametrize(
    ("device", "advice"),
    [("cpu", "multigpu run --cpu 1"), ("cuda", "one process sees every GPU")],
)
def test_dp_at_several_processes_names_the_flag_for_the_device(device: str, advice: str) -> None:
    from multigpu.strategies.dp import DataParallelStrategy

    # bind() validates before touching the device, so cuda is only a name here.
    with pytest.raises(multigpu.UsageError, match=f"world_size=2.*{advice}"):
        DataParallelStrategy().bind(torch.device(device), 2)


def test_unknown_strategy_and_backend_errors():
    with pytest.raises(multigpu.UsageError, match="strategy='fsdp9' is not known"):
        multigpu.init("fsdp9", environ=PLAIN)
    with pytest.raises(multigpu.DeviceError, match="backend='nccl'.*CPU"):
        multigpu.init(backend="nccl", environ=PLAIN)
    with pytest.raises(multigpu.DeviceError, match="not known"):
        backend_for(torch.device("cpu"), "mpi2")
    assert backend_for(torch.device("cpu")) == "gloo"
    assert backend_for(torch.device("cuda", 0)) == "nccl"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_cuda_requested_without_cuda_is_an_error() -> None:
    with pytest.raises(multigpu.DeviceError, match="MULTIGPU_DEVICE=cpu"):
        multigpu.init(accelerator="cuda", environ=PLAIN)  # what `multigpu run --cpu` sets
    with pytest.raises(multigpu.DeviceError, match="no CUDA device"):
        multigpu.init(accelerator="cuda", environ={})


def test_seed_sets_every_rng_identically():
    def draw() -> tuple[float, float, float]:
        return random.random(), float(np.random.rand()), float(torch.rand(()))

    multigpu.init(seed=123, environ=PLAIN).teardown()
    first = draw()
    multigpu.init(seed=123, environ=PLAIN).teardown()
    assert draw() == first
    with pytest.raises(multigpu.UsageError, match="seed=-1"):
        multigpu.init(seed=-1, environ=PLAIN)


def test_timeout_must_be_positive():
    with pytest.raises(multigpu.UsageError, match="timeout=0"):
        multigpu.init(timeout=0, environ=PLAIN)


class Pair(NamedTuple):
    a: torch.Tensor
    b: int


@dataclass
class Batch:
    x: torch.Tensor
    label: str


def test_move_to_device_keeps_structure():
    obj = {
        "t": torch.ones(1),
        "l": [torch.zeros(2), 3],
        "p": Pair(torch.ones(1), 2),
        "d": Batch(torch.ones(1), "x"),
    }
    moved = move_to_device(obj, "cpu")
    assert isinstance(moved["p"], Pair) and moved["p"].b == 2
    assert isinstance(moved["d"], Batch) and moved["d"].label == "x"
    assert moved["l"][1] == 3 and moved["t"].device.type == "cpu"


def test_print_on_rank_zero_only(capsys):
    with multigpu.init(environ=PLAIN) as ctx:
        ctx.print("a", 1, sep="-")
    assert capsys.readouterr().out == "a-1\n"


def test_cpu_sync_batchnorm_alone_is_batchnorm_and_keeps_values():
    from multigpu.strategies.sync_batchnorm import CPUSyncBatchNorm, convert_sync_batchnorm

    torch.manual_seed(0)
    plain = nn.Sequential(nn.Conv2d(2, 3, 1), nn.BatchNorm2d(3, momentum=None))
    with torch.no_grad():
        plain[1].weight.uniform_()
    converted = convert_sync_batchnorm(
        nn.Sequential(nn.Conv2d(2, 3, 1), nn.BatchNorm2d(3, momentum=None)), torch.device("cpu")
    )
    converted.load_state_dict(plain.state_dict())
    assert isinstance(converted[1], CPUSyncBatchNorm)
    x = torch.randn(4, 2, 5, 5)
    assert torch.allclose(converted(x), plain(x))
    assert torch.allclose(converted[1].running_var, plain[1].running_var)
    converted.eval()
    plain.eval()
    assert torch.allclose(converted(x), plain(x))

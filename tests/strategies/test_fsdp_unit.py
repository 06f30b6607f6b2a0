"""FSDP in this process (a one-rank group: FSDP2 needs one even alone): what it refuses, and why."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import torch
from torch import nn

import multigpu
from multigpu.data import make_loader


@pytest.fixture
def ctx() -> Iterator[multigpu.Context]:
    with multigpu.init(strategy="fsdp", seed=0, accelerator="cpu", environ={}) as context:
        yield context


def test_one_process_fsdp_has_a_group_of_its_own_and_a_named_mesh(ctx: multigpu.Context) -> None:
    import torch.distributed as dist

    assert dist.is_initialized() and dist.get_world_size() == 1
    assert ctx.world_size == 1 and not ctx.is_distributed
    assert ctx.mesh.mesh_dim_names == ("dp_shard",)
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    model, opt = ctx.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    assert opt.param_groups[0]["params"][0] is next(model.parameters())  # re-pointed
    ctx.backward(model(torch.ones(3, 4)).sum())
    ctx.step(opt)


def test_a_model_without_parameters_is_refused(ctx: multigpu.Context) -> None:
    with pytest.raises(multigpu.UsageError, match="no parameters"):
        ctx.setup(nn.ReLU())


def test_float16_and_join_are_refused_with_what_to_use_instead() -> None:
    with pytest.raises(multigpu.UsageError, match="use precision='bf16-mixed'"):
        multigpu.init(strategy="fsdp", precision="16-mixed", accelerator="cpu", environ={})
    with multigpu.init(strategy="fsdp", accelerator="cpu", environ={}) as ctx:
        model = ctx.setup(nn.Linear(2, 2))
        with pytest.raises(multigpu.UsageError, match="drop_last=True"):
            ctx.join(model)


def test_optimizer_state_loaded_before_setup_is_refused(ctx: multigpu.Context) -> None:
    net = nn.Linear(2, 2)
    opt = torch.optim.Adam(net.parameters())
    net(torch.ones(1, 2)).sum().backward()
    opt.step()
    with pytest.raises(multigpu.UsageError, match="load optimizer state after ctx.setup"):
        ctx.setup(net, opt)


def test_a_meta_model_that_cannot_be_initialised_is_refused_before_anything_is_allocated(
    ctx: multigpu.Context,
) -> None:
    class Scale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gain = nn.Parameter(torch.ones(3))

    with ctx.init_module():
        net = nn.Sequential(nn.Linear(3, 3), Scale())
    with pytest.raises(multigpu.UsageError, match=r"1 \(Scale: gain\).*reset_parameters"):
        ctx.setup(net)
    assert net[0].weight.is_meta  # untouched


def test_cpu_offload_on_cpu_processes_says_so_once_and_trains(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    offload = multigpu.FSDPStrategy(cpu_offload=True)
    with multigpu.init(strategy=offload, accelerator="cpu", environ={}) as ctx:
        net = nn.Linear(2, 2)
        model, opt = ctx.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        ctx.backward(model(torch.ones(1, 2)).sum())
        ctx.step(opt)
    warnings = [r.getMessage() for r in caplog.records if "cpu_offload" in r.getMessage()]
    assert len(warnings) == 1 and "ignored" in warnings[0]


def test_bad_options_are_usage_errors() -> None:
    with pytest.raises(multigpu.UsageError, match="nn.Module classes"):
        multigpu.FSDPStrategy(blocks=("Block",))  # type: ignore[arg-type]
    with pytest.raises(multigpu.UsageError, match="min_block_params"):
        multigpu.FSDPStrategy(min_block_params=0)
    with pytest.raises(multigpu.UsageError, match="does not divide the world size 4"):
        multigpu.MeshShape(dp_replicate=3).resolve(4)
    assert multigpu.MeshShape(dp_replicate=2).resolve(4).sizes == (2, 2)


def test_even_batches_give_a_rank_short_of_data_an_empty_batch() -> None:
    data = torch.utils.data.TensorDataset(torch.arange(10.0).reshape(5, 2), torch.arange(5))
    loaders = [
        make_loader(data, batch_size=4, rank=r, world_size=2, shuffle=False, even_batches=True)
        for r in (0, 1)
    ]
    batches = [list(loader) for loader in loaders]
    assert [len(b) for b in batches] == [2, 2] and [len(ld) for ld in loaders] == [2, 2]
    assert batches[1][1][0].shape == (0, 2) and batches[1][1][1].shape == (0,)
    seen = sorted(int(i) for b in batches for _, idx in b for i in idx)
    assert seen == [0, 1, 2, 3, 4]  # every sample once, nothing padded with duplicates
    mean = multigpu.Mean()
    mean.update(torch.tensor(float("nan")), weight=0)  # the mean loss of an empty batch
    mean.update(torch.tensor(2.0), weight=3)
    assert mean.compute() == 2.0

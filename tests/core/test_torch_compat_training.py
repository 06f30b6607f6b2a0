"""Canaries of ``multigpu.torch_compat.training``: PowerSGD without CUDA, gradient norms by
parts, what a loss averaged over, and pipeline stage names (see test_torch_compat.py)."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch import nn

from multigpu import torch_compat


@pytest.fixture
def group() -> Iterator[None]:
    """A one-rank gloo group with an in-memory store (FSDP2 needs a group even alone)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _names_in(code: object) -> set[str]:
    names = set(code.co_names)  # type: ignore[attr-defined]
    for const in code.co_consts:  # type: ignore[attr-defined]
        if hasattr(const, "co_names"):
            names |= _names_in(const)
    return names


def test_powersgd_still_synchronizes_cuda_inside_its_own_code() -> None:
    """The copy sees no CUDA only if the call is in the hook's own code (its nested functions
    included); when torch stops calling it on a CPU device, ``powersgd_hook_for`` can go."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as module

    assert {"cuda", "is_available", "synchronize"} <= _names_in(module.powerSGD_hook.__code__)
    copy = torch_compat.without_cuda(module.powerSGD_hook)
    assert copy.__globals__["torch"].cuda.is_available() is False
    assert copy.__globals__["torch"].bmm is torch.bmm and copy.__name__ == "powerSGD_hook"


def test_the_copy_without_cuda_trains_exactly_like_torchs_hook(group: None) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as module
    from torch.nn.parallel import DistributedDataParallel

    finals = []
    for hook in (module.powerSGD_hook, torch_compat.without_cuda(module.powerSGD_hook)):
        torch.manual_seed(0)
        model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 4)))
        state = module.PowerSGDState(None, start_powerSGD_iter=2, random_seed=0)
        model.register_comm_hook(state, hook)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(6):
            torch.manual_seed(step)
            model(torch.randn(8, 16)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        assert state.compression_stats()[0] > 1  # PowerSGD compressed
        finals.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*finals, strict=True))


def test_dtensor_still_warns_about_sequential_collectives_on_the_logger_we_filter(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The message ``quiet_sequential_redistribution`` drops: its logger's name and wording."""
    import inspect

    from torch.distributed.tensor import _redistribute

    assert _redistribute.logger.name == torch_compat.REDISTRIBUTE_LOGGER
    assert "sequential" in inspect.getsource(_redistribute._warn_flatten_optimization_not_possible)
    logger = logging.getLogger(torch_compat.REDISTRIBUTE_LOGGER)
    with caplog.at_level(logging.WARNING, logger=logger.name):
        with torch_compat.quiet_sequential_redistribution():
            logger.warning("While redistributing, %d sequential all_reduce operations", 2)
            logger.warning("another message")
        logger.warning("%d sequential operations, outside the block", 2)
    assert [r.getMessage() for r in caplog.records] == [
        "another message",
        "2 sequential operations, outside the block",
    ]


def test_the_gradient_norm_by_parts_matches_torchs_clip_grad_norm_on_every_path() -> None:
    """``grad_norm`` then ``clip_with_norm`` (and their pre-2.6 arithmetic) must clip exactly
    as ``clip_grad_norm_`` does: the pipeline relies on it for every torch it accepts."""
    torch.manual_seed(0)
    grads = [torch.randn(5, 3), torch.randn(7)]
    for norm_type in (2.0, 1.0, float("inf")):
        expected = [g.clone() for g in grads]
        params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
        for p, g in zip(params, expected, strict=True):
            p.grad = g
        want = torch.nn.utils.clip_grad_norm_(params, 0.5, norm_type)
        for norm, clip in (
            (torch_compat.grad_norm, torch_compat.clip_with_norm),
            (
                torch_compat.training._grad_norm_before_2_6,
                torch_compat.training._clip_with_norm_before_2_6,
            ),
        ):
            mine = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
            for p, g in zip(mine, grads, strict=True):
                p.grad = g.clone()
            total = norm([p.grad for p in mine if p.grad is not None], norm_type)
            clip(mine, 0.5, total)
            assert torch.allclose(total, want)
            for p, q in zip(mine, params, strict=True):
                assert torch.allclose(p.grad, q.grad)
    assert float(torch_compat.training._grad_norm_before_2_6([], 2.0)) == 0.0


def test_mean_over_ignored_reads_what_a_cross_entropy_mean_saved() -> None:
    cross_entropy = torch.nn.functional.cross_entropy
    logits = torch.randn(6, 5, requires_grad=True)
    labels = torch.tensor([1, 2, -100, 3, -100, 0])
    assert torch_compat.mean_over_ignored(cross_entropy(logits, labels) / 4) == (2, 6)
    per_token = logits.view(2, 3, 5).transpose(1, 2)  # (batch, classes, positions): the 2-D node
    assert torch_compat.mean_over_ignored(cross_entropy(per_token, labels.view(2, 3))) == (2, 6)
    summed = cross_entropy(logits, labels, reduction="sum")
    assert torch_compat.mean_over_ignored(summed) is None
    assert torch_compat.mean_over_ignored(cross_entropy(logits, labels.clamp(min=0))) is None


class _RunsItsFirstBlockTwice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in (*self.blocks, self.blocks[0]):
            x = block(x)
        return x


@pytest.mark.filterwarnings("ignore:.*LeafSpec:FutureWarning")  # torch 2.13's export's own
def test_a_module_run_again_in_another_pipeline_stage_is_named_with_a_call_suffix() -> None:
    """``shared_tensors`` maps a stage's copy of a reused module back by its name: torch.export
    names the second call ``blocks.0@1``, and pipelining copies its parameters into that stage
    (``Pipe.replicated_params``); the schedules' ``scale_grads`` option exists (2.7+)."""
    from torch.distributed.pipelining import Schedule1F1B, ScheduleInterleaved1F1B, SplitPoint
    from torch.distributed.pipelining import pipeline as split

    model, spec = _RunsItsFirstBlockTwice(), {"blocks.2": SplitPoint.BEGINNING}
    pipe = split(model, (torch.zeros(2, 4),), split_spec=spec)
    copied = dict(pipe.get_stage_module(1).named_parameters())
    assert "blocks.0@1.weight" in copied
    assert torch_compat.unflattened_name("blocks.0@1.weight") == "blocks.0.weight"
    assert {"submod_0": "blocks.0.weight", "submod_1": "blocks.0@1.weight"} in [
        {k.replace("_pp", ""): v for k, v in m.items()} for m in pipe.replicated_params
    ]
    for schedule in (Schedule1F1B, ScheduleInterleaved1F1B):
        assert torch_compat.unscaled_schedule_kwargs(schedule) == {"scale_grads": False}


def test_ddp_imports_what_the_fork_server_preloads() -> None:
    # In a fresh interpreter: here DDP_IMPORTS are loaded already. If torch stops importing one
    # of them at DDP's construction, the preload in run_distributed is dead weight: drop it.
    code = (
        "import sys, torch, torch.distributed as dist\n"
        "from multigpu.torch_compat import DDP_IMPORTS\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        "before = [m for m in DDP_IMPORTS if m in sys.modules]\n"
        "torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))\n"
        "after = [m for m in DDP_IMPORTS if m in sys.modules]\n"
        "dist.destroy_process_group()\n"
        "print(before, after)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == f"[] {list(torch_compat.DDP_IMPORTS)}", done.stdout


def test_a_grad_scalers_per_optimizer_record_is_what_the_replica_groups_read_and_set() -> None:
    """replicas/step_gate.py: forget an unscale (a share set aside), then make the found infs
    agree (the groups' summed gradients decide skip or step, and the scale's update)."""
    from multigpu.torch_compat import scaler_forget_unscale, scaler_set_found_inf, scaler_unscaled

    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([weight], lr=1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    scaler.scale(torch.ones(()))  # the scale is made lazily, by the first scale()
    weight.grad = torch.full((3,), 4.0)
    assert not scaler_unscaled(scaler, optimizer)
    scaler.unscale_(optimizer)
    assert scaler_unscaled(scaler, optimizer) and torch.equal(weight.grad, torch.ones(3))
    scaler_forget_unscale(scaler, optimizer)
    assert not scaler_unscaled(scaler, optimizer)
    weight.grad = torch.full((3,), 4.0)
    scaler.unscale_(optimizer)  # allowed again: torch raised without the forgetting
    scaler_set_found_inf(scaler, optimizer, True)
    scaler.step(optimizer)
    scaler.update()
    assert torch.equal(weight.detach(), torch.ones(3)) and scaler.get_scale() == 2.0  # skipped
    weight.grad = torch.full((3,), 2.0)
    scaler.unscale_(optimizer)
    scaler_set_found_inf(scaler, optimizer, False)
    scaler.step(optimizer)
    assert torch.equal(weight.detach(), torch.zeros(3))  # stepped: 1 - 1.0 * 2/2

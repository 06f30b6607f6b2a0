"""One canary per private or version-dependent torch API multigpu uses (``multigpu.torch_compat``).

Each test fails loudly when a torch release moves or changes the thing it checks, so that an
upgrade of torch is this file's run and ``torch_compat.py``'s edit.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader

from multigpu import torch_compat
from multigpu.checkpoint.sharded import (
    METADATA_FILE,
    load_sharded,
    read_metadata,
    save_sharded,
)
from multigpu.errors import CheckpointError
from multigpu.strategies import state


@pytest.fixture
def group() -> Iterator[None]:
    """A one-rank gloo group with an in-memory store (FSDP2 needs a group even alone)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_version_is_parsed_and_fsdp2_is_there() -> None:
    major, minor = torch.__version__.split(".")[:2]
    assert (int(major), int(minor)) == torch_compat.TORCH_VERSION
    assert torch_compat.TORCH_VERSION >= torch_compat.FSDP_MIN_VERSION


def test_fully_shard_makes_fsdp_modules_with_dtensor_parameters(group: None) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp_shard",))
    net = nn.Linear(5, 3)
    policy = torch_compat.mixed_precision_policy(
        param_dtype=torch.bfloat16, reduce_dtype=torch.float32, output_dtype=torch.float32
    )
    torch_compat.fully_shard(net, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    assert isinstance(net, torch_compat.fsdp_module_class())
    assert torch_compat.is_dtensor(net.weight) and not torch_compat.is_dtensor(torch.ones(1))
    whole = torch.arange(15.0).reshape(3, 5)
    assert torch.equal(torch_compat.distribute_like(whole, net.weight), whole)
    for method in ("set_requires_gradient_sync", "set_reshard_after_backward"):
        assert callable(getattr(net, method))  # FSDPStrategy.no_sync calls them
    assert net(torch.ones(2, 5)).dtype == torch.float32  # output_dtype honoured
    assert type(torch_compat.cpu_offload_policy()).__name__ == "CPUOffloadPolicy"


def test_our_dcp_metadata_reader_reads_what_torch_writes(tmp_path: Path) -> None:
    net = nn.Linear(3, 2)
    opt = torch.optim.Adam(net.parameters())
    net(torch.ones(1, 3)).sum().backward()
    opt.step()
    save_sharded(
        {"model": state.model_state(net), "optim": state.optimizer_state(net, opt)}, tmp_path
    )
    ours = read_metadata(tmp_path)  # the allow-list: DCP_METADATA_GLOBALS
    theirs = FileSystemReader(tmp_path).read_metadata()
    assert ours.state_dict_metadata == theirs.state_dict_metadata
    assert ours.planner_data == theirs.planner_data  # read_whole rebuilds objects from it
    assert ("optim", "param_groups", 0, "lr") in ours.planner_data.values()


def test_a_hostile_dcp_metadata_file_is_refused(tmp_path: Path) -> None:
    class Boom:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (print, ("this would have run",))

    (tmp_path / METADATA_FILE).write_bytes(pickle.dumps(Boom()))
    with pytest.raises(CheckpointError, match=r"builtins\.print is not a class"):
        read_metadata(tmp_path)


class _Opaque:
    """Not plain data: weights_only loading refuses it."""

    value = 3


def test_a_value_weights_only_cannot_load_is_refused_by_the_load_planner(tmp_path: Path) -> None:
    dcp.save({"x": {"w": torch.ones(2), "extra": _Opaque()}}, checkpoint_id=tmp_path, no_dist=True)
    target = {"x": {"w": torch.zeros(2), "extra": None}}
    with pytest.raises(CheckpointError, match="'x.extra' of the checkpoint is not plain data"):
        load_sharded(target, tmp_path)


def test_torch_still_creates_optimizer_state_when_asked_for_it() -> None:
    """Why strategies.state saves an optimizer that has not stepped without asking torch."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    net = nn.Linear(2, 2)
    opt = torch.optim.Adam(net.parameters())
    assert state.optimizer_state(net, opt)["state"] == {} and not opt.state
    get_optimizer_state_dict(net, opt)
    assert opt.state and float(opt.state[net.weight]["step"]) == 1.0  # torch stepped it


def test_a_modules_own_tensor_tables_are_the_live_ones() -> None:
    net = nn.BatchNorm1d(3)
    tables = torch_compat.own_tensor_tables(net)
    assert set(tables["param"]) == {"weight", "bias"}
    assert {"running_mean", "running_var", "num_batches_tracked"} <= set(tables["buffer"])
    tables["buffer"]["running_mean"] = torch.full((3,), 7.0)  # what materialize does
    assert torch.equal(net.running_mean, torch.full((3,), 7.0))


def test_the_elastic_agent_still_calls_the_methods_multigpu_overrides() -> None:
    """launch/restart_reports.py and launch/agent.py override three of SimpleElasticAgent's
    protected methods and read ``_remaining_restarts``; torch's run loop must still use them."""
    import inspect

    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    loop = inspect.getsource(SimpleElasticAgent._invoke_run)
    for call in ("self._monitor_workers(", "self._restart_workers(", "self._remaining_restarts"):
        assert call in loop, f"torch's agent loop no longer uses {call}"
    assert "self._rendezvous(" in inspect.getsource(SimpleElasticAgent._initialize_workers)
    for name in ("_monitor_workers", "_restart_workers", "_rendezvous"):
        assert list(inspect.signature(getattr(LocalElasticAgent, name)).parameters) == [
            "self",
            "worker_group",
        ], name


def test_torchrun_still_builds_a_no_python_command_from_the_parsed_arguments() -> None:
    """launch/orphans.py rewrites the parsed arguments (training_script, no_python, module)."""
    from torch.distributed.run import config_from_args, parse_args

    args = parse_args(["--nproc-per-node=1", "--no-python", "prog", "a"])
    _, cmd, cmd_args = config_from_args(args)
    assert (cmd, cmd_args) == ("prog", ["a"])


def test_the_elastic_agent_still_ends_through_the_exit_barrier_multigpu_overrides() -> None:
    """launch/exit_agreement.py overrides ``_invoke_run`` and ``_exit_barrier`` and reads
    ``_store`` and ``_exit_barrier_timeout``: torch's run loop must still call the barrier once
    the workers succeed, and ``run`` must still go through ``_invoke_run``."""
    import inspect

    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    loop = inspect.getsource(SimpleElasticAgent._invoke_run)
    assert "self._exit_barrier()" in loop, "torch's agent loop no longer ends in _exit_barrier"
    assert "self._invoke_run(role)" in inspect.getsource(SimpleElasticAgent.run)
    assert list(inspect.signature(SimpleElasticAgent._invoke_run).parameters) == ["self", "role"]
    assert list(inspect.signature(SimpleElasticAgent._exit_barrier).parameters) == ["self"]
    barrier = inspect.getsource(SimpleElasticAgent._exit_barrier)
    assert "self._store" in barrier and "self._exit_barrier_timeout" in barrier


def test_fsdp_state_and_mesh_still_keep_their_process_groups_where_teardown_drops_them() -> None:
    """torch_compat.drop_fsdp_process_groups / drop_mesh_process_groups reach FSDP2's per-module
    state and DeviceMesh's group table (private)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        from torch.distributed.device_mesh import init_device_mesh

        net = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
        mesh = init_device_mesh("cpu", (1,))
        torch_compat.fully_shard(net[0], mesh=mesh)
        torch_compat.fully_shard(net, mesh=mesh)
        assert torch_compat.drop_fsdp_process_groups(net) >= 2  # one group per sharded module
        assert torch_compat.drop_fsdp_process_groups(net) == 0  # none left to drop
        assert torch_compat.drop_mesh_process_groups(mesh) == 1  # the mesh's one axis
    finally:
        dist.destroy_process_group()


def test_torchrun_still_builds_its_agent_and_rendezvous_handler_through_the_names_we_replace() -> (
    None
):
    """launch/agent.py replaces ``launcher.api.LocalElasticAgent`` and
    ``rendezvous.registry.get_rendezvous_handler`` for the time of a launch: torch's
    ``launch_agent`` must still look both up by those module names when it runs."""
    import inspect

    import torch.distributed.elastic.rendezvous.registry as rdzv_registry
    import torch.distributed.launcher.api as launcher_api

    source = inspect.getsource(launcher_api.launch_agent)
    assert "rdzv_registry.get_rendezvous_handler(" in source
    assert "LocalElasticAgent(" in source
    assert launcher_api.rdzv_registry is rdzv_registry
    assert callable(rdzv_registry.get_rendezvous_handler)


def test_the_agent_class_has_every_protected_member_multigpu_uses() -> None:
    """torch_compat.elastic_agent_class: the overridden methods exist (a torch without them is
    refused there) and SimpleElasticAgent still sets the attributes the overrides read."""
    import inspect

    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    agent = torch_compat.elastic_agent_class()
    assert all(callable(getattr(agent, name)) for name in torch_compat.AGENT_OVERRIDES)
    init = inspect.getsource(SimpleElasticAgent.__init__)
    for name in torch_compat.AGENT_ATTRIBUTES:
        assert f"self.{name} =" in init, f"SimpleElasticAgent no longer sets {name}"


def test_launch_agent_made_by_replaces_both_names_for_the_block_only() -> None:
    import torch.distributed.elastic.rendezvous.registry as rdzv_registry
    import torch.distributed.launcher.api as launcher_api

    before = (launcher_api.LocalElasticAgent, rdzv_registry.get_rendezvous_handler)
    seen: list[object] = []

    def handler(make: object, params: object) -> str:
        seen.append((make, params))
        return "handler"

    with torch_compat.launch_agent_made_by(dict, handler):
        assert launcher_api.LocalElasticAgent is dict
        assert rdzv_registry.get_rendezvous_handler("params") == "handler"
    assert seen == [(before[1], "params")]
    assert (launcher_api.LocalElasticAgent, rdzv_registry.get_rendezvous_handler) == before


def test_the_default_store_is_the_groups_store() -> None:
    """hang/watchdog.py meets the other ranks in it (``_get_default_store``, private)."""
    import torch.distributed as dist

    store = dist.HashStore()
    store.set_timeout(timedelta(seconds=5))  # a key that never comes fails, not hangs
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        torch_compat.default_store().set("multigpu-canary", "1")
        # torch wraps the group's store in a prefix: the key lands below the one given.
        assert [k for k in _keys(store) if k.endswith("multigpu-canary")], _keys(store)
    finally:
        dist.destroy_process_group()


def _keys(store: object) -> list[str]:
    return [k.decode() if isinstance(k, bytes) else k for k in store.list_keys()]  # type: ignore[attr-defined]


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
            (torch_compat._grad_norm_before_2_6, torch_compat._clip_with_norm_before_2_6),
        ):
            mine = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
            for p, g in zip(mine, grads, strict=True):
                p.grad = g.clone()
            total = norm([p.grad for p in mine if p.grad is not None], norm_type)
            clip(mine, 0.5, total)
            assert torch.allclose(total, want)
            for p, q in zip(mine, params, strict=True):
                assert torch.allclose(p.grad, q.grad)
    assert float(torch_compat._grad_norm_before_2_6([], 2.0)) == 0.0


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
    """``pipeline_shared`` maps a stage's copy of a reused module back by its name: torch.export
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

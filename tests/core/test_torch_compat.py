"""One canary per private or version-dependent torch API multigpu uses (``multigpu.torch_compat``).

Each test fails loudly when a torch release moves or changes the thing it checks, so that an
upgrade of torch is this file's run (and test_torch_compat_training.py's) and an edit of the
``torch_compat`` package.
"""

from __future__ import annotations

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
from multigpu.checkpoint.native.sharded import (
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


def test_an_optimizer_steps_without_its_hooks_through_the_function_torch_wrapped() -> None:
    """``step_without_hooks`` calls the ``__wrapped__`` of the class's ``hooked`` step: torch
    must still wrap it so, run the hooks only in the wrapper, and an LR scheduler must still
    count steps through the instance's own ``step``."""
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    net = nn.Linear(2, 2)
    opt = torch.optim.Adam(net.parameters())
    step = type(opt).step
    assert step.hooked and step.__wrapped__ is not step  # type: ignore[attr-defined]
    called: list[str] = []
    handles = [
        opt.register_step_pre_hook(lambda *_: called.append("pre")),
        opt.register_step_post_hook(lambda *_: called.append("post")),
        register_optimizer_step_pre_hook(lambda *_: called.append("global pre")),
        register_optimizer_step_post_hook(lambda *_: called.append("global post")),
    ]
    try:
        scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
        assert "step" in vars(opt)  # the scheduler's counting wrapper, on the instance
        opt._opt_called = False  # type: ignore[attr-defined]
        for p in net.parameters():
            p.grad = torch.ones_like(p)
        torch_compat.step_without_hooks(opt)
        assert called == [] and float(opt.state[net.weight]["step"]) == 1.0
        assert not opt._opt_called  # type: ignore[attr-defined]
        opt.step()
        assert called == ["global pre", "pre", "post", "global post"]
        assert opt._opt_called  # type: ignore[attr-defined]
        del scheduler
    finally:
        for handle in handles:
            handle.remove()


def test_a_dtensor_made_from_a_local_piece_is_laid_out_as_the_one_it_is_like(group: None) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (1,))
    net = nn.Linear(5, 3)
    torch_compat.fully_shard(net, mesh=mesh)
    local = torch.zeros(net.weight.to_local().shape)
    made = torch_compat.dtensor_from_local_like(local, net.weight)
    assert torch_compat.is_dtensor(made)
    assert made.to_local().data_ptr() == local.data_ptr()  # no copy: the piece itself
    assert (made.shape, made.stride(), made.placements) == (
        net.weight.shape,
        net.weight.stride(),
        net.weight.placements,
    )
    net.weight.grad = made  # accepted as the parameter's gradient


def test_a_modules_own_tensor_tables_are_the_live_ones() -> None:
    net = nn.BatchNorm1d(3)
    tables = torch_compat.own_tensor_tables(net)
    assert set(tables["param"]) == {"weight", "bias"}
    assert {"running_mean", "running_var", "num_batches_tracked"} <= set(tables["buffer"])
    tables["buffer"]["running_mean"] = torch.full((3,), 7.0)  # what materialize does
    assert torch.equal(net.running_mean, torch.full((3,), 7.0))


def test_the_elastic_agent_still_calls_the_methods_multigpu_overrides() -> None:
    """launch/agent/ overrides ``_monitor_workers`` and, from its result and
    ``_remaining_restarts``, says the restart torch's run loop is about to make; the loop must
    still restart exactly then, and still ask the handler's public ``num_nodes_waiting`` before
    a membership restart (launch/agent/rendezvous.py says it there). Its rendezvous must still go
    through the handler's public ``next_rendezvous`` once (the nodes' check, the round's
    report)."""
    import inspect

    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    loop = inspect.getsource(SimpleElasticAgent._invoke_run)
    for call in (
        "run_result = self._monitor_workers(self._worker_group)",
        "elif state in {WorkerState.UNHEALTHY, WorkerState.FAILED}:\n"
        "                if self._remaining_restarts > 0:",
        "self._remaining_restarts -= 1\n                    self._restart_workers(",
        "num_nodes_waiting = rdzv_handler.num_nodes_waiting()",
    ):
        assert call in loop, f"torch's agent loop no longer has {call!r}"
    assert inspect.getsource(SimpleElasticAgent._rendezvous).count(".next_rendezvous()") == 1
    assert list(inspect.signature(LocalElasticAgent._monitor_workers).parameters) == [
        "self",
        "worker_group",
    ]


def test_torchrun_still_builds_a_no_python_command_from_the_parsed_arguments() -> None:
    """launch/orphans.py rewrites the parsed arguments (training_script, no_python, module)."""
    from torch.distributed.run import config_from_args, parse_args

    args = parse_args(["--nproc-per-node=1", "--no-python", "prog", "a"])
    _, cmd, cmd_args = config_from_args(args)
    assert (cmd, cmd_args) == ("prog", ["a"])


def test_the_elastic_agent_still_ends_through_the_exit_barrier_multigpu_overrides() -> None:
    """launch/agent/ extends ``run`` and overrides ``_exit_barrier``, reading the round's
    store from ``get_worker_group().store``: torch's run loop must still call the barrier once
    the workers succeed, ``run`` must still return the loop's result, and each rendezvous must
    still give the worker group the round's store."""
    import inspect

    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    loop = inspect.getsource(SimpleElasticAgent._invoke_run)
    assert "self._exit_barrier()" in loop, "torch's agent loop no longer ends in _exit_barrier"
    run = inspect.getsource(SimpleElasticAgent.run)
    assert "result = self._invoke_run(role)" in run and "return result" in run
    assert list(inspect.signature(SimpleElasticAgent.run).parameters) == ["self", "role"]
    assert list(inspect.signature(SimpleElasticAgent._exit_barrier).parameters) == ["self"]
    assert "worker_group.store = store" in inspect.getsource(SimpleElasticAgent._rendezvous)
    assert "return self._worker_group" in inspect.getsource(SimpleElasticAgent.get_worker_group)


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


def test_fully_shard_takes_a_list_of_modules_sharing_a_weight_from_torch_2_5(group: None) -> None:
    """fsdp_ties groups the modules holding a tied weight with ``fully_shard([a, b])``; 2.4's
    ``fully_shard`` takes one module (the gate then keeps tied weights with the root)."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (1,))
    emb, head = nn.Embedding(6, 4), nn.Linear(4, 6, bias=False)
    head.weight = emb.weight
    net = nn.Sequential(emb, head)
    if not torch_compat.fully_shard_takes_module_lists():  # the gate is still needed there
        with pytest.raises(Exception):  # noqa: B017 (whatever 2.4 raises for a list)
            torch_compat.fully_shard([emb, head], mesh=mesh)
        return
    torch_compat.fully_shard([emb, head], mesh=mesh)
    torch_compat.fully_shard(net, mesh=mesh)
    assert isinstance(emb, torch_compat.fsdp_module_class()) and emb.weight is head.weight
    net(torch.tensor([1, 2])).sum().backward()
    assert emb.weight.grad is not None
    torch_compat.drop_fsdp_process_groups(net)


def test_torchrun_still_builds_its_agent_and_rendezvous_handler_through_the_names_we_replace() -> (
    None
):
    """launch/agent/ replaces ``launcher.api.LocalElasticAgent`` and
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


def test_sharded_tensor_is_where_import_before_process_groups_finds_it() -> None:
    # What it guards (gloo threads past teardown) is test_teardown_threads; this names the module.
    import sys

    torch_compat.import_before_process_groups()
    assert torch_compat.SHARDED_TENSOR_MODULE in sys.modules

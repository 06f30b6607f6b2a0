"""Every torch API that is private or moved between releases, in one place, behind a version gate.

multigpu supports ``torch>=2.4``. What changed between releases, or is private, is reached through
this module only, and ``tests/core/test_torch_compat.py`` has one test per entry that fails loudly
when a torch release changes it, so upgrading torch is this file and that test.

- **FSDP2** (``fully_shard``, ``FSDPModule``, ``MixedPrecisionPolicy``, ``CPUOffloadPolicy``):
  public in ``torch.distributed.fsdp`` since 2.6, private ``torch.distributed._composable.fsdp``
  in 2.4 and 2.5.
- **DTensor**: public ``torch.distributed.tensor`` since 2.5, ``torch.distributed._tensor`` before.
- **A module's own tensors**: ``nn.Module._parameters`` / ``_buffers`` (meta-device
  materialization swaps whole tensors in and out of them).
- **FSDP2's process groups**: ``FSDPModule._get_fsdp_state()._fsdp_param_groups`` (one
  ``_fsdp_param_group`` before 2.8) and their ``mesh_info`` / ``post_forward_mesh_info``, which
  keep the groups alive after ``destroy_process_group`` (dropped at teardown); so does
  ``DeviceMesh._pg_registry`` (2.9+).
- **DCP metadata unpickling**: a DCP checkpoint's ``.metadata`` file is a pickle, which torch reads
  with plain ``pickle.load`` (any code in it runs). ``DCP_METADATA_GLOBALS`` lists the globals a
  metadata file written by torch names — some private (``_StorageInfo``, ``_get_layout``,
  ``_MEM_FORMAT_ENCODING``) — so that multigpu can read one with an allow-list instead.
- **Where store servers are made**: the module name ``TCPStore`` of the c10d and static
  rendezvous backends and of ``torch.distributed.rendezvous`` (``env://``, ``tcp://``), and
  ``DynamicRendezvousHandler._create_tcp_store_server``: for the time of a block they make their
  servers through multigpu (``store_listen``: bound to one address, not every interface).
- **The elastic agent's protected methods** (``AGENT_OVERRIDES``): ``launch/agent.py``,
  ``restart_reports`` and ``exit_agreement`` override ``LocalElasticAgent``'s rendezvous,
  monitor, restart, run loop and exit barrier (torch offers no hooks for them), and torch's
  ``launch_agent`` is made to build that agent and a handler that waits for the store through
  the module names ``launcher.api.LocalElasticAgent`` and ``registry.get_rendezvous_handler``
  (``launch_agent_made_by``). ``elastic_agent_class`` refuses a torch whose agent lacks them.
- **The default group's store** (``distributed_c10d._get_default_store``): where the hang
  watchdog's ranks leave their reports outside any collective (``default_store``).
- **PowerSGD on CPU tensors where CUDA is present**: ``powerSGD_hook`` ends with
  ``if torch.cuda.is_available(): torch.cuda.synchronize(device)`` on the gradients' device,
  which raises for CPU processes on a GPU machine (seen with torch 2.11; the same code is in
  2.13). ``powersgd_hook_for`` gives CPU models a copy of the hook that sees no CUDA.
- **DTensor's redistribution logger** (``torch.distributed.tensor._redistribute``): it warns on
  every rank that a partial norm on a 2-D mesh is reduced by one all-reduce per mesh axis;
  ``quiet_sequential_redistribution`` drops that one message while the tensor-parallel
  strategy makes its gradient norms whole (a handful of scalars) and while a whole state dict
  is gathered (once per save), where one all-gather per axis costs nothing that matters.
- **Gradient norms by parts** (``torch.nn.utils.get_total_norm``, ``clip_grads_with_norm_``):
  public since 2.6; before, ``grad_norm`` and ``clip_with_norm`` do the same arithmetic (the
  pipeline sums its stages' norms across processes between the two).
- **Pipeline stages** (``torch.distributed.pipelining``): ``torch.export``'s unflattening names
  the second call of a module ``name@1`` (``unflattened_name`` maps it back); schedules scale
  the gradients by the micro-batches themselves since 2.7 (``unscaled_schedule_kwargs`` turns
  that off where it exists: the pipeline scales once, a tensor shared by two stages included).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import logging
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

TORCH_VERSION: tuple[int, int] = tuple(  # type: ignore[assignment]
    int(part) for part in torch.__version__.split("+")[0].split(".")[:2]
)
"""(major, minor) of the installed torch."""

FSDP_MIN_VERSION = (2, 4)
"""The first torch with FSDP2 (``fully_shard`` on a DeviceMesh)."""


def _fsdp() -> Any:
    if TORCH_VERSION >= (2, 6):
        return importlib.import_module("torch.distributed.fsdp")
    return importlib.import_module("torch.distributed._composable.fsdp")  # 2.4, 2.5: private


def fully_shard(module: torch.nn.Module, **kwargs: Any) -> Any:
    """FSDP2's ``fully_shard`` (``torch.distributed.fsdp.fully_shard``)."""
    return _fsdp().fully_shard(module, **kwargs)


def fsdp_module_class() -> type:
    """FSDP2's ``FSDPModule``: every module ``fully_shard`` was applied to is an instance."""
    return _fsdp().FSDPModule


def mixed_precision_policy(**kwargs: Any) -> Any:
    """FSDP2's ``MixedPrecisionPolicy(param_dtype=..., reduce_dtype=..., output_dtype=...)``."""
    return _fsdp().MixedPrecisionPolicy(**kwargs)


def cpu_offload_policy() -> Any:
    """FSDP2's ``CPUOffloadPolicy()`` (parameters, gradients and optimizer state in CPU RAM)."""
    return _fsdp().CPUOffloadPolicy()


def is_dtensor(value: object) -> bool:
    """Whether ``value`` is a DTensor (a sharded or replicated distributed tensor)."""
    if TORCH_VERSION >= (2, 5):
        from torch.distributed.tensor import DTensor
    else:
        from torch.distributed._tensor import DTensor
    return isinstance(value, DTensor)


def distribute_like(full: torch.Tensor, like: Any) -> torch.Tensor:
    """This rank's shard of ``full`` laid out as the DTensor ``like`` (no communication).

    Every rank holds the same ``full`` tensor; the local piece is cut out, as
    ``distribute_tensor(..., src_data_rank=None)`` does (torch >= 2.5).
    """
    if TORCH_VERSION >= (2, 5):
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(
            full, like.device_mesh, like.placements, src_data_rank=None
        ).to_local()
    from torch.distributed._tensor import distribute_tensor as old_distribute

    return old_distribute(full, like.device_mesh, like.placements).to_local()


def own_tensor_tables(module: torch.nn.Module) -> dict[str, dict[str, Any]]:
    """``{"param": ..., "buffer": ...}``: the live tables of ``module``'s own parameters and
    buffers (``nn.Module._parameters``, ``_buffers``); entries may be None."""
    return {"param": module._parameters, "buffer": module._buffers}


def drop_fsdp_process_groups(module: torch.nn.Module) -> int:
    """Let go of the process groups FSDP2's state keeps for ``module`` and its submodules (set to
    None); returns how many references were dropped.

    For teardown only (the module cannot communicate afterwards): held there, a destroyed gloo
    group keeps its threads until interpreter finalization.
    """
    import torch.distributed as tdist

    dropped = 0
    for sub in module.modules():
        if not isinstance(sub, fsdp_module_class()):
            continue
        state = sub._get_fsdp_state()  # type: ignore[operator]
        groups = getattr(state, "_fsdp_param_groups", None)
        if groups is None:
            one = getattr(state, "_fsdp_param_group", None)
            groups = [] if one is None else [one]
        for group in groups:
            for info in (group.mesh_info, getattr(group, "post_forward_mesh_info", None)):
                for name, value in list(vars(info).items()) if info is not None else []:
                    if isinstance(value, tdist.ProcessGroup):
                        setattr(info, name, None)
                        dropped += 1
    return dropped


def drop_mesh_process_groups(mesh: Any) -> int:
    """Let go of the process groups a ``DeviceMesh`` keeps by name (``_pg_registry``); returns
    how many. For teardown only, like ``drop_fsdp_process_groups``."""
    registry = getattr(mesh, "_pg_registry", None)
    if not isinstance(registry, dict):
        return 0  # a torch whose meshes resolve their groups through c10d's own table
    dropped = len(registry)
    registry.clear()
    return dropped


DCP_METADATA_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {
        ("pathlib", "PosixPath"),
        ("pathlib", "WindowsPath"),
        ("collections", "OrderedDict"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.distributed.checkpoint.metadata", "BytesStorageMetadata"),
        ("torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"),
        ("torch.distributed.checkpoint.metadata", "Metadata"),
        ("torch.distributed.checkpoint.metadata", "MetadataIndex"),
        ("torch.distributed.checkpoint.metadata", "StorageMeta"),
        ("torch.distributed.checkpoint.metadata", "TensorProperties"),
        ("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"),
        ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),
    }
)
"""The (module, name) globals a DCP ``.metadata`` pickle may name, besides torch dtypes."""


def dcp_metadata_global_allowed(module: str, name: str) -> bool:
    """Whether a DCP metadata pickle may load the global ``module.name`` (dtypes included)."""
    if (module, name) in DCP_METADATA_GLOBALS:
        return True
    return module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)


STORE_MODULES = (
    "torch.distributed.rendezvous",
    "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend",
    "torch.distributed.elastic.rendezvous.static_tcp_rendezvous",
)
"""The modules that build their ``TCPStore`` servers through their module name ``TCPStore``."""


@contextlib.contextmanager
def store_servers_made_by(make: Callable[..., Any], *, elastic: bool = True) -> Iterator[None]:
    """Inside the block, torch's rendezvous code makes each ``TCPStore`` through
    ``make(TCPStore, host, port, *args, **kwargs)`` (clients too: ``make`` tells them apart by
    ``is_master``). ``elastic``: the agent's too (its rendezvous backends and the store its
    handler shares with the workers); False: only ``init_process_group``'s (a worker's)."""
    import torch.distributed as tdist

    def store(*args: Any, **kwargs: Any) -> Any:
        return make(tdist.TCPStore, *args, **kwargs)

    def shared_server(self: Any, master_addr: str, master_port: int) -> Any:
        # torch's own: TCPStore(host_name=..., port=..., is_master=True, multi_tenant=True)
        return make(tdist.TCPStore, master_addr, master_port, is_master=True, multi_tenant=True)

    patches: list[tuple[Any, str, Any]] = [
        (importlib.import_module(name), "TCPStore", store)
        for name in (STORE_MODULES if elastic else STORE_MODULES[:1])
    ]
    if elastic:
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
            DynamicRendezvousHandler as handler,
        )

        patches.append((handler, "_create_tcp_store_server", shared_server))
    originals = [(owner, name, owner.__dict__[name]) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in originals:
            setattr(owner, name, value)


AGENT_OVERRIDES = (
    "_rendezvous",
    "_monitor_workers",
    "_restart_workers",
    "_invoke_run",
    "_exit_barrier",
)
"""``LocalElasticAgent``'s protected methods that multigpu's agent overrides (launch/)."""

AGENT_ATTRIBUTES = ("_remaining_restarts", "_store", "_exit_barrier_timeout")
"""Its protected attributes those overrides read."""


def elastic_agent_class() -> type:
    """torchrun's ``LocalElasticAgent``, to subclass (RuntimeError when it lacks one of
    ``AGENT_OVERRIDES``)."""
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    missing = [
        name for name in AGENT_OVERRIDES if not callable(getattr(LocalElasticAgent, name, None))
    ]
    if missing:
        raise RuntimeError(
            f"torch {torch.__version__}'s LocalElasticAgent has no {', '.join(missing)}, which "
            "multigpu's launcher overrides; install a torch release multigpu supports"
        )
    return LocalElasticAgent


@contextlib.contextmanager
def launch_agent_made_by(
    agent: Callable[..., Any], handler: Callable[[Callable[..., Any], Any], Any]
) -> Iterator[None]:
    """Inside the block torchrun's ``launch_agent`` builds its agent with ``agent(...)`` (the
    arguments of ``LocalElasticAgent``) and its rendezvous handler with
    ``handler(get_rendezvous_handler, params)`` (torch's maker, to call when ready)."""
    import torch.distributed.elastic.rendezvous.registry as rdzv_registry
    import torch.distributed.launcher.api as launcher_api

    original_agent = launcher_api.LocalElasticAgent
    make_handler = rdzv_registry.get_rendezvous_handler
    setattr(launcher_api, "LocalElasticAgent", agent)  # noqa: B010 (a module attribute)
    setattr(rdzv_registry, "get_rendezvous_handler", functools.partial(handler, make_handler))  # noqa: B010
    try:
        yield
    finally:
        setattr(launcher_api, "LocalElasticAgent", original_agent)  # noqa: B010
        setattr(rdzv_registry, "get_rendezvous_handler", make_handler)  # noqa: B010


def default_store() -> Any:
    """The default process group's store (raises when the group has none, or none exists)."""
    from torch.distributed.distributed_c10d import _get_default_store

    return _get_default_store()


class _TorchWithoutCuda(types.ModuleType):
    """``torch`` as a module global, except that ``cuda.is_available()`` is False."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.cuda = types.SimpleNamespace(is_available=lambda: False)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def powersgd_hook_for(device: torch.device) -> Callable[..., Any]:
    """torch's ``powerSGD_hook`` for ``device``'s gradients, usable on CPU where CUDA is present."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as module

    hook = module.powerSGD_hook
    if device.type != "cpu" or not torch.cuda.is_available():
        return hook
    assert isinstance(hook, types.FunctionType)  # a plain Python function: its globals swap
    return without_cuda(hook)


def without_cuda(fn: types.FunctionType) -> types.FunctionType:
    """A copy of ``fn`` (and of the functions it defines) for which ``torch.cuda`` is absent."""
    scope = {**fn.__globals__, "torch": _TorchWithoutCuda()}
    copy = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__annotations__ = fn.__annotations__
    copy.__doc__ = fn.__doc__
    return copy


REDISTRIBUTE_LOGGER = "torch.distributed.tensor._redistribute"


def _not_sequential(record: logging.LogRecord) -> bool:
    return "sequential" not in str(record.msg)


@contextlib.contextmanager
def quiet_sequential_redistribution() -> Iterator[None]:
    """Within the block, DTensor does not warn about sequential collectives (other messages
    pass)."""
    logger = logging.getLogger(REDISTRIBUTE_LOGGER)
    logger.addFilter(_not_sequential)
    try:
        yield
    finally:
        logger.removeFilter(_not_sequential)


def grad_norm(grads: list[torch.Tensor], norm_type: float) -> torch.Tensor:
    """The ``norm_type`` norm of ``grads`` taken together (torch's ``get_total_norm``)."""
    if TORCH_VERSION >= (2, 6):
        return torch.nn.utils.get_total_norm(grads, norm_type)
    return _grad_norm_before_2_6(grads, norm_type)


def _grad_norm_before_2_6(grads: list[torch.Tensor], norm_type: float) -> torch.Tensor:
    if not grads:
        return torch.tensor(0.0)
    norms = [torch.linalg.vector_norm(g, norm_type).to(grads[0].device) for g in grads]
    return torch.linalg.vector_norm(torch.stack(norms), norm_type)


def clip_with_norm(
    parameters: Iterable[torch.Tensor], max_norm: float, total: torch.Tensor
) -> None:
    """Scale the gradients so that their norm ``total`` becomes at most ``max_norm``."""
    if TORCH_VERSION >= (2, 6):
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total)
    else:
        _clip_with_norm_before_2_6(parameters, max_norm, total)


def _clip_with_norm_before_2_6(
    parameters: Iterable[torch.Tensor], max_norm: float, total: torch.Tensor
) -> None:
    scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for p in parameters:
        if p.grad is not None:
            p.grad.mul_(scale.to(p.grad.device))


def unflattened_name(name: str) -> str:
    """``name`` without ``torch.export``'s call suffixes: ``blocks.0@1.0@1.weight`` (a module's
    second call, traced into another pipeline stage) is ``blocks.0.0.weight``."""
    return ".".join(part.split("@", 1)[0] for part in name.split("."))


def unscaled_schedule_kwargs(schedule: type) -> dict[str, Any]:
    """Arguments that keep ``schedule`` from dividing the gradients by the micro-batches
    (``scale_grads=False``, 2.7+); a schedule without the option (before 2.7) never divides."""
    return {"scale_grads": False} if "scale_grads" in inspect.signature(schedule).parameters else {}

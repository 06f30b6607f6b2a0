"""Process group set-up and teardown, and collectives that are no-ops at world size 1.

Every wait is bounded: the process group gets a timeout (default 300 s, far below torch's 30
minutes), so a rank that never arrives turns into an error instead of a silent hang.
"""

from __future__ import annotations

import functools
import gc
import logging
import re
from datetime import timedelta
from typing import Any, Literal, TypeVar

import torch
import torch.distributed as dist

from multigpu.common.store_listen import listening_store
from multigpu.common.store_reach import StoreUnreachable, wait_until_listening
from multigpu.env.types import ClusterEnv
from multigpu.errors import EnvError, UsageError
from multigpu.torch_compat import (
    import_before_process_groups,
    set_group_timeout,
    store_servers_made_by,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
ReduceOp = Literal["sum", "mean", "max", "min", "prod"]

_GROUPS_MADE: list[str] = []
"""The init method of each default group ``init_process_group`` made in this process."""

_OPS = {
    "sum": dist.ReduceOp.SUM,
    "mean": dist.ReduceOp.SUM,  # divided afterwards: gloo has no AVG
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "prod": dist.ReduceOp.PRODUCT,
}


def collective_timeout(timeout: float | timedelta | None, default_s: float) -> timedelta:
    """Return the collective timeout: the argument, else ``default_s`` (the settings' value)."""
    if isinstance(timeout, timedelta):
        seconds = timeout.total_seconds()
    else:
        seconds = default_s if timeout is None else float(timeout)
    if seconds <= 0:
        raise UsageError(f"timeout={seconds} s must be positive; give e.g. timeout=300")
    return timedelta(seconds=seconds)


def is_initialized() -> bool:
    """True when a default process group exists."""
    return dist.is_available() and dist.is_initialized()


def init_process_group(
    env: ClusterEnv, device: torch.device, backend: str, timeout: timedelta
) -> bool:
    """Create the default process group for ``env`` unless there is a single process.

    torchrun-launched workers rendezvous through ``env://`` (torchrun's own variables, and its
    agent's store when it shares it); SLURM and MPI tasks through ``tcp://master_addr:master_port``
    so nothing has to be written into ``os.environ``. True when this call created the group.

    A group that exists already (Ray Train makes it before the training function runs, with
    its own 1800 s) is adopted: it gets ``timeout``, so that a collective waits as long as this
    job's hang tools expect, not half an hour.
    """
    if is_initialized():
        set_group_timeout(timeout)
        log.debug("adopted the existing process group; its timeout is now %s", timeout)
        return False
    if env.world_size == 1:
        return False
    if not dist.is_available():
        raise EnvError(
            f"world_size={env.world_size} needs torch.distributed, which this torch build "
            f"({torch.__version__}) lacks; install a torch build with distributed support"
        )
    init_method = (
        "env://" if env.source == "torchrun" else f"tcp://{env.master_addr}:{env.master_port}"
    )
    # Binds the communicator to this rank's GPU at once: no guessing "cuda:0" on every rank.
    kwargs: dict[str, Any] = {"device_id": device} if device.type == "cuda" else {}
    log.debug(
        "init_process_group backend=%s init=%s rank=%s/%s",
        backend,
        init_method,
        env.rank,
        env.world_size,
    )
    wait_for_store(env, timeout)
    # Rank 0's store (when the agent does not share its own) on MASTER_ADDR, not every interface.
    servers = functools.partial(listening_store, many_nodes=env.num_nodes > 1)
    import_before_process_groups()
    try:
        with store_servers_made_by(servers, elastic=False):
            dist.init_process_group(
                backend=backend,
                rank=env.rank,
                world_size=env.world_size,
                timeout=timeout,
                **_rendezvous(init_method, env, timeout),
                **kwargs,
            )
    except RuntimeError as e:  # DistStoreError: a rank that never came
        text = str(e).lower()
        if "timeout" not in text and "timed out" not in text:
            raise
        raise EnvError(_join_timeout_message(env, timeout, str(e))) from e
    _GROUPS_MADE.append(init_method)
    return True


def _rendezvous(init_method: str, env: ClusterEnv, timeout: timedelta) -> dict[str, Any]:
    """How the default group meets: the first one of a process through ``init_method``, as
    torch does; a later one (``multigpu.init`` again in the same workers, after a teardown)
    through the same store under a prefix of its own.

    torch names every new default group ``0`` again, so a second group on the same store (the
    launcher's agent keeps one for the whole run) read the first one's keys — the addresses of
    gloo's closed connections: seen as "Connection reset by peer" in four runs of five, and once
    as a hang of both ranks in the group's creation.
    """
    made = len(_GROUPS_MADE)
    if not made:
        return {"init_method": init_method}
    store, _, _ = next(
        dist.rendezvous(init_method, rank=env.rank, world_size=env.world_size, timeout=timeout)
    )
    store.set_timeout(timeout)
    return {"store": dist.PrefixStore(f"multigpu/group-{made}", store)}


def wait_for_store(env: ClusterEnv, timeout: timedelta) -> None:
    """Wait, within ``timeout``, until the process group's store accepts connections; raise
    EnvError naming it when it never does. Rank 0 hosts the store (no wait) unless the agent
    does.

    torch's own client waits longer than its timeout when nothing answers (retries with
    back-off: 47 s for 20 s), and then fails with a bare ``DistNetworkError``.
    """
    # torchrun's agent shares its own store with its workers: then every rank is its client.
    agent = env.source == "torchrun" and env.agent_store
    if env.rank == 0 and not agent:
        return
    try:
        wait_until_listening(env.master_addr, env.master_port, timeout.total_seconds())
    except StoreUnreachable as e:
        host = "the launcher of node 0" if agent else "rank 0"
        raise EnvError(
            f"rank {env.rank} of {env.world_size} waited {timeout.total_seconds():g} s for the "
            f"process group's store at {env.master_addr}:{env.master_port} (hosted by {host}) "
            f"and nothing answered ({e.last_error}); expected {host} to be running: it was not "
            "started, failed before it (see its output), or MASTER_ADDR/MASTER_PORT point "
            "elsewhere; start every rank with the same MASTER_ADDR and MASTER_PORT within the "
            "timeout (MULTIGPU_TIMEOUT, multigpu.init(timeout=...))"
        ) from e


def _join_timeout_message(env: ClusterEnv, timeout: timedelta, torch_text: str) -> str:
    where = f"{env.master_addr}:{env.master_port}"
    joined = re.search(r"(\d+)/(\d+) clients joined", torch_text)
    if joined and env.rank == 0:  # the store's host counted who connected
        came = int(joined.group(1))
        return (
            f"rank 0 of {env.world_size} ({env.num_nodes} node(s)) waited "
            f"{timeout.total_seconds():g} s at the process group's store it hosts at {where} "
            f"for the other {env.world_size - 1} of {env.world_size} ranks; only {came} of "
            f"{env.world_size} joined: the others were not started, failed before joining (see "
            "their output), or were given another MASTER_ADDR/MASTER_PORT or WORLD_SIZE; start "
            f"all {env.world_size} ranks with the same ones within the timeout (MULTIGPU_TIMEOUT)"
        )
    return (
        f"rank {env.rank} of {env.world_size} ({env.num_nodes} node(s)) waited "
        f"{timeout.total_seconds():g} s for the other ranks to join the process group at "
        f"{where}; expected all {env.world_size} to join: a node did not start or failed before "
        "joining (see its output), or the nodes were started with different --nnodes / "
        "--nproc-per-node; start every node with the same options"
    )


def init_single_process_group(device: torch.device, backend: str, timeout: timedelta) -> bool:
    """A process group of this process alone, for code that needs one at world size 1 (FSDP's
    mesh). Its store lives in memory: nothing listens on any port. Returns True (created)."""
    kwargs: dict[str, Any] = {"device_id": device} if device.type == "cuda" else {}
    import_before_process_groups()
    dist.init_process_group(
        backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout, **kwargs
    )
    return True


def destroy_process_group() -> None:
    """Collect garbage, then destroy every process group (if any), then collect again.

    The ``gc.collect()`` first matters: with torch 2.13, freeing a DDP reducer while gloo's
    background thread shuts down took two locks in opposite orders and hung rank 0 at exit in 3
    of 46 runs; freeing everything before the group goes away fixed it (60 of 60). The one after
    frees the groups themselves now, so their gloo threads end while the interpreter is whole:
    a group still referenced at finalization keeps threads that abort the process there when
    one reaches for the GIL ("terminate called without an active exception").
    """
    gc.collect()
    if is_initialized():
        dist.destroy_process_group()
        gc.collect()


def new_gloo_group(timeout: float) -> Any:
    """A new gloo group over every rank, for background work (collective: every rank calls it).

    Background threads must not use the default group: their collectives would interleave with
    the training's, in a different order on each rank.
    """
    return dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout))


def world_size() -> int:
    """World size of the default group, 1 without one."""
    return dist.get_world_size() if is_initialized() else 1


def barrier() -> None:
    """Wait for every rank (no-op at world size 1)."""
    if is_initialized():
        dist.barrier()


def all_reduce(value: T, op: ReduceOp = "mean", device: torch.device | None = None) -> T:
    """Reduce a tensor or a Python number over every rank and return it on every rank.

    Tensors are reduced out of place (the argument is not modified) and returned with their
    dtype; numbers come back as float (``mean``) or their own type.
    """
    if op not in _OPS:
        raise UsageError(f"op={op!r} is not known; expected one of {sorted(_OPS)}")
    size = world_size()
    if isinstance(value, torch.Tensor):
        if size == 1:
            return value.clone()  # type: ignore[return-value]
        work = value.detach().clone()
        if op == "mean" and not work.is_floating_point():
            work = work.to(torch.float64)
        dist.all_reduce(work, op=_OPS[op])
        if op == "mean":
            work = work / size
        return work  # type: ignore[return-value]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(
            f"all_reduce got {type(value).__name__}; expected a tensor, int or float "
            "(use ctx.gather for other objects)"
        )
    if size == 1:
        return float(value) if op == "mean" else value  # type: ignore[return-value]
    tensor = torch.tensor(float(value), dtype=torch.float64, device=device or torch.device("cpu"))
    result = all_reduce(tensor, op).item()
    if op != "mean" and isinstance(value, int):
        return int(result)  # type: ignore[return-value]
    return result  # type: ignore[return-value]


def gather(value: Any, device: torch.device | None = None) -> list[Any]:
    """Return ``[value of rank 0, value of rank 1, ...]`` on every rank.

    Tensors may differ in their first dimension between ranks; they are exchanged with
    ``all_gather`` after padding and the padding is cut off again, so no element is duplicated.
    Other (picklable) objects go through ``all_gather_object``.
    """
    if isinstance(value, torch.Tensor) and world_size() > 1:
        return _gather_tensor(value, device or value.device)
    return gather_objects_small(value)


def _gather_tensor(value: torch.Tensor, device: torch.device) -> list[torch.Tensor]:
    tensor = value.detach().to(device)
    scalar = tensor.dim() == 0
    if scalar:
        tensor = tensor.reshape(1)
    meta = gather_objects_small((tuple(tensor.shape), str(tensor.dtype)))
    shapes = [m[0] for m in meta]
    if len({m[1] for m in meta}) != 1 or len({s[1:] for s in shapes}) != 1:
        raise UsageError(
            f"gather got tensors whose dtypes or trailing shapes differ across ranks ({meta}); "
            "only the first dimension may differ"
        )
    longest = max(s[0] for s in shapes)
    padded = torch.zeros((longest, *tensor.shape[1:]), dtype=tensor.dtype, device=device)
    padded[: tensor.shape[0]] = tensor
    buffers = [torch.empty_like(padded) for _ in meta]  # one per rank
    dist.all_gather(buffers, padded)
    parts = [buf[: shape[0]] for buf, shape in zip(buffers, shapes, strict=True)]
    return [p.reshape(()) for p in parts] if scalar else parts


def gather_objects_small(value: Any) -> list[Any]:
    """``all_gather_object`` for small metadata (no-op list at world size 1)."""
    if world_size() == 1:
        return [value]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, value)
    return out


def broadcast(value: T, src: int = 0) -> T:
    """Return rank ``src``'s ``value`` on every rank (tensors in place, objects by pickle)."""
    if world_size() == 1:
        return value
    if isinstance(value, torch.Tensor):
        dist.broadcast(value, src=src)
        return value
    box = [value if dist.get_rank() == src else None]
    dist.broadcast_object_list(box, src=src)
    return box[0]  # type: ignore[return-value]

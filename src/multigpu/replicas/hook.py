"""``ReplicaHook``: how a worker of one replica group attaches to its Context, script unchanged.

``init()`` adds it when the launcher set the replica variables (``multigpu.replicas.settings``);
a life that starts after the job ended exits at once there, one that starts after it failed ends
with its line (``Coordinator.check_job_state``).

- ``ctx.setup(model, optimizer)``: the model and optimizers join what a healing group receives
  (``multigpu.replicas.heal_state``, with the LR schedulers found on them and the GradScaler),
  torchft's manager starts, and the steps are decided by ``multigpu.replicas.step_gate``
  through the Context's ``before_step`` hook and each optimizer's step pre-hook — the user's
  objects are not patched.
- ``ctx.loader(...)`` with whole global batches (training; ``drop_last``) reads this group's
  shares of each step (``multigpu.replicas.shares``; a stream is read whole by every group); a
  loader that keeps the last partial batch (evaluation) is read whole by every group, its
  results reduced inside the group. Every loader's position heals.
- ``ctx.checkpointer(...)``: its step count heals, it counts only the steps that stepped, and it
  saves the job's step with the checkpoint (``JobStep``): after a restart of every group, the
  groups heal from the one whose checkpoint is furthest ahead.
- ``ctx.is_main``: true on rank 0 of the one group that writes (``Coordinator.writes``).
- The Context's end: a clean end of the loop is the job's end; the counts go to the job's record.

Refused with one line: strategies other than single/ddp/fsdp (pipeline and tensor parallel split
the model, not the data) and ``ctx.backward(num_items=...)`` (its count is a group's only).
"""

from __future__ import annotations

import ipaddress
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from multigpu.common.replica_record import JobRecord
from multigpu.common.store_bound import store_call_bound
from multigpu.common.store_listen import listening_store
from multigpu.data.stream_loader import StreamLoader
from multigpu.env.types import ClusterEnv
from multigpu.errors import UsageError
from multigpu.instruments.hooks import Hook
from multigpu.replicas.coordinator import Coordinator
from multigpu.replicas.heal_state import HealState
from multigpu.replicas.settings import ReplicaSettings
from multigpu.replicas.shares import IndexSteps, ReplicaSteps, StreamSteps, replica_sampler
from multigpu.replicas.step_gate import StepGate
from multigpu.runtime import dist

STRATEGIES = ("single", "ddp", "fsdp")


def _record(settings: ReplicaSettings, rank: int, timeout_s: float) -> JobRecord:
    """Rank 0's client of the job's record (the other ranks hear from it: ``Coordinator``)."""
    if rank != 0 or settings.store is None:
        return JobRecord(None)
    from datetime import timedelta

    from torch.distributed import TCPStore

    host, _, port = settings.store.rpartition(":")
    wait = min(timeout_s, 60.0)
    # A record whose node vanished (no reset, no answer) fails a call after the kernel's bound,
    # not after ~15 minutes (multigpu.common.store_bound).
    store = store_call_bound(TCPStore, wait)(
        host.strip("[]"),
        int(port),
        is_master=False,
        timeout=timedelta(seconds=wait),
        wait_for_workers=False,
    )
    return JobRecord(store)


def replica_hook(
    settings: ReplicaSettings, env: ClusterEnv, device: torch.device, timeout_s: float
) -> ReplicaHook:
    """The hook of a worker of replica group ``settings.group`` (rank ``env.rank`` in it); exits
    at once when the job already ended (see the module doc)."""
    coordinator = Coordinator(
        settings,
        rank=env.rank,
        world_size=env.world_size,
        device=device,
        timeout_s=timeout_s,
        record=_record(settings, env.rank, timeout_s),
    )
    coordinator.check_job_state()
    return ReplicaHook(coordinator, many_nodes=not ipaddress.ip_address(settings.host).is_loopback)


class JobStep:
    """The job's committed steps, saved with each checkpoint of a replica group (optional: a
    checkpoint written without replica groups resumes too)."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator

    def state_dict(self) -> dict[str, int]:
        return self.coordinator.job_step()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.coordinator.job_step_loaded(state)


class ReplicaHook(Hook):
    """Fault tolerance across replica groups for one worker (see the module doc)."""

    def __init__(self, coordinator: Coordinator, *, many_nodes: bool) -> None:
        self.coordinator = coordinator
        self.many_nodes = many_nodes
        self.state = HealState()
        self.gate = StepGate(coordinator)
        self._store: Any = None  # the cross-group store this group's rank 0 hosts: kept alive
        self._model: nn.Module | None = None
        coordinator.set_state(self.state.save, self._healed)
        coordinator.watch_parameters(lambda: [p for m in self.state.models for p in m.parameters()])
        # A clean end of the loop is the job's end. Without `with multigpu.init()` the Context
        # ends at exit, after an uncaught exception too: Python's excepthook runs first.
        self._clean: bool | None = None
        self._excepthook = sys.excepthook
        sys.excepthook = self._uncaught

    def _uncaught(self, *info: Any) -> None:
        self._clean = False
        self._excepthook(*info)

    def _healed(self, state: Any, source: int) -> list[str]:
        return self.state.load(state, source)

    def on_setup(
        self, ctx: Any, model: nn.Module, optimizers: Sequence[torch.optim.Optimizer]
    ) -> None:
        name = ctx.strategy.name
        if name not in STRATEGIES:
            raise UsageError(
                f"strategy {name!r} under --replicas: replica groups replicate the data-parallel "
                f"model; inside a group use one of {', '.join(STRATEGIES)}, or run without "
                "--replicas"
            )
        if self._model is not None:
            raise UsageError(
                "ctx.setup ran twice under --replicas; give every optimizer of the model to one "
                "ctx.setup(model, *optimizers): its state is what a rejoining group heals from"
            )
        self._model = plain = ctx.strategy.unwrap(model)
        self.state.add_setup(plain, optimizers)
        self.state.scaler = self.gate.scaler = ctx.precision.scaler
        self.gate.attach(_parameters(plain, optimizers), optimizers)
        self.coordinator.start(self._make_store)

    def _make_store(self, host: str) -> tuple[str, int]:
        if self.coordinator.rank == 0:
            from torch.distributed import TCPStore

            self._store = listening_store(
                TCPStore, host_name=host, port=0, is_master=True, wait_for_workers=False,
                many_nodes=self.many_nodes,
            )  # fmt: skip
        port = dist.broadcast(int(self._store.port) if self._store is not None else 0)
        return host, int(port)

    def on_loader(self, ctx: Any, loader: Any) -> None:
        layout = loader if isinstance(loader, StreamLoader) else loader.sampler  # a LaidOut
        if layout.drop_last:  # training: this group's shares of each step
            c = self.coordinator
            groups, width = c.settings.groups, layout.world_size
            batch, k = layout.global_batch_size, layout.accumulation_steps
            parts = groups * width * k
            if batch % parts:
                low, high = (batch // parts) * parts, (batch // parts + 1) * parts
                raise UsageError(
                    f"batch_size={batch} does not split into {groups} replica groups x "
                    f"{width} process(es) x accumulation_steps={k}: each process's share would "
                    f"be {batch / parts:.2f} samples; use a multiple of {parts}, e.g. "
                    + (f"{low} or {high}" if low else f"{high}")
                )
            steps: ReplicaSteps
            if isinstance(loader, StreamLoader):
                steps = StreamSteps(loader, c, self.gate, self.state, width, groups)
            else:
                loader.sampler = replica_sampler(
                    loader.sampler, groups=groups, group=c.settings.group
                )
                steps = IndexSteps(loader, c, self.gate, self.state, width=width)
            loader.replica_steps = steps
        self.state.add_loader(loader)  # evaluation's too: its epoch count (a shuffle) heals

    def on_checkpointer(self, ctx: Any, checkpointer: Any) -> None:
        checkpointer.track_optional(multigpu_replica_job=JobStep(self.coordinator))
        self.state.add_checkpointer(checkpointer)

    def before_step(self, ctx: Any, optimizers: Sequence[torch.optim.Optimizer]) -> bool:
        return self.gate.decide(optimizers)

    def counts_step(self, ctx: Any) -> bool:
        return self.gate.counts

    def writes_outputs(self, ctx: Any) -> bool:
        return self.coordinator.writes

    def wrap_backward(self, ctx: Any, backward: Callable[..., None]) -> Callable[..., None]:
        def refusing_num_items(loss: torch.Tensor, num_items: Any = None, **kwargs: Any) -> None:
            if num_items is not None:
                raise UsageError(
                    "ctx.backward(num_items=...) under --replicas: the count of items would be "
                    "this group's only; pass a mean loss (no num_items), or run without --replicas"
                )
            backward(loss, **kwargs)

        return refusing_num_items

    def on_exit(self, ctx: Any, error: BaseException | None) -> None:
        self._clean = error is None

    def on_teardown(self, ctx: Any) -> None:
        if sys.excepthook == self._uncaught:
            sys.excepthook = self._excepthook
        self.gate.detach()
        self.coordinator.close(clean=self._clean is not False)


def _parameters(
    model: nn.Module, optimizers: Sequence[torch.optim.Optimizer]
) -> list[torch.Tensor]:
    seen: dict[int, torch.Tensor] = {id(p): p for p in model.parameters()}
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            for p in group["params"]:
                seen.setdefault(id(p), p)
    return list(seen.values())

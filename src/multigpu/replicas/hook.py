"""``ReplicaHook``: how a worker of one replica group attaches to its Context, script unchanged.

``init()`` adds it when the launcher set the replica variables (``multigpu.replicas.settings``).

- ``ctx.setup(model, optimizer)``: the model's and optimizers' state become what a healing group
  receives, torchft's manager starts, and each optimizer is gated (``gate_optimizer``): its
  ``step()`` runs only at the last micro-batch of a step and only when the groups commit it,
  after the gradients were summed over the groups; its ``zero_grad()`` does nothing between the
  micro-batches of one step (the survivors' extra shares accumulate).
- ``ctx.loader(...)`` with whole global batches (training; ``drop_last``) reads this group's
  shares of each step (``multigpu.replicas.shares``); a loader that keeps the last partial batch
  (evaluation) is read whole by every group, its results reduced inside the group.
- The Context's teardown says the summary and stops the manager.

Refused with one line: strategies other than single/ddp/fsdp (pipeline and tensor parallel split
the model, not the data), ``precision="16-mixed"`` (the GradScaler skips steps on its own, which
the groups would not agree on) and ``ctx.backward(num_items=...)`` (its count is a group's only).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from multigpu.common.store_listen import listening_store
from multigpu.env.types import ClusterEnv
from multigpu.errors import UsageError
from multigpu.instruments.hooks import Hook
from multigpu.replicas.coordinator import Coordinator
from multigpu.replicas.settings import ReplicaSettings
from multigpu.replicas.shares import ReplicaSteps, replica_sampler
from multigpu.runtime import dist

STRATEGIES = ("single", "ddp", "fsdp")


def replica_hook(
    settings: ReplicaSettings, env: ClusterEnv, device: torch.device, timeout_s: float
) -> ReplicaHook:
    """The hook of a worker of replica group ``settings.group`` (rank ``env.rank`` in it)."""
    coordinator = Coordinator(
        settings, rank=env.rank, world_size=env.world_size, device=device, timeout_s=timeout_s
    )
    return ReplicaHook(coordinator, many_nodes=not ipaddress.ip_address(settings.host).is_loopback)


class ReplicaHook(Hook):
    """Fault tolerance across replica groups for one worker (see the module doc)."""

    def __init__(self, coordinator: Coordinator, *, many_nodes: bool) -> None:
        self.coordinator = coordinator
        self.many_nodes = many_nodes
        self._store: Any = None  # the cross-group store this group's rank 0 hosts: kept alive
        self._model: nn.Module | None = None

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
        if ctx.precision.scaler is not None:
            raise UsageError(
                "precision='16-mixed' under --replicas: its GradScaler skips steps on its own, "
                "which the replica groups would not agree on; use precision='bf16-mixed' or '32'"
            )
        if self._model is not None:
            raise UsageError(
                "ctx.setup ran twice under --replicas; give every optimizer of the model to one "
                "ctx.setup(model, *optimizers): its state is what a rejoining group heals from"
            )
        self._model = plain = ctx.strategy.unwrap(model)
        c = self.coordinator
        c.add_state(plain.state_dict, plain.load_state_dict)
        parameters = _parameters(plain, optimizers)
        for optimizer in optimizers:
            c.add_state(optimizer.state_dict, optimizer.load_state_dict)
            gate_optimizer(optimizer, c, parameters)
        c.start(self._make_store)

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
        if not loader.sampler.drop_last:
            return  # evaluation: every group reads all of it
        c = self.coordinator
        loader.sampler = replica_sampler(
            loader.sampler, groups=c.settings.groups, group=c.settings.group
        )
        width = loader.sampler.world_size // c.settings.groups
        loader.replica_steps = ReplicaSteps(loader, c, width=width)
        c.add_state(loader.state_dict, loader.load_state_dict)

    def wrap_backward(self, ctx: Any, backward: Callable[..., None]) -> Callable[..., None]:
        def refusing_num_items(loss: torch.Tensor, num_items: Any = None, **kwargs: Any) -> None:
            if num_items is not None:
                raise UsageError(
                    "ctx.backward(num_items=...) under --replicas: the count of items would be "
                    "this group's only; pass a mean loss (no num_items), or run without --replicas"
                )
            backward(loss, **kwargs)

        return refusing_num_items

    def on_teardown(self, ctx: Any) -> None:
        self.coordinator.close()


def _parameters(
    model: nn.Module, optimizers: Sequence[torch.optim.Optimizer]
) -> list[torch.Tensor]:
    seen: dict[int, torch.Tensor] = {id(p): p for p in model.parameters()}
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            for p in group["params"]:
                seen.setdefault(id(p), p)
    return list(seen.values())


def gate_optimizer(
    optimizer: torch.optim.Optimizer, c: Coordinator, parameters: Sequence[torch.Tensor]
) -> None:
    """Make ``optimizer.step()`` / ``zero_grad()`` follow the replica groups' steps (in place:
    the user's object, so ``optimizer.step()`` in the loop is gated as ``ctx.step`` is)."""
    step, zero_grad = optimizer.step, optimizer.zero_grad
    stepped = [-1]  # the step (Coordinator.serial) this optimizer last stepped in

    def gated_step(*args: Any, **kwargs: Any) -> Any:
        if not c.in_step and not optimizer.state:
            # Before any step, with no state yet: a checkpoint restore making the optimizer's
            # state (torch.distributed.checkpoint steps it with zero gradients), not training.
            return step(*args, **kwargs)
        if not c.in_step:
            raise UsageError(
                "optimizer.step() under --replicas outside a step of ctx.loader(...): the "
                "groups agree on each step at its first batch; iterate a training loader made "
                "by ctx.loader (drop_last) and step inside the loop"
            )
        optimizer.multigpu_skipped_step = True  # type: ignore[attr-defined]
        if not c.ends_step:
            c.step_waits = True  # ctx.step's zero_grad, next, must keep the gradient
            return None  # an extra share or micro-batch of the step follows
        if c.decided is None:
            c.finish_step(parameters)
        if not c.decided:
            zero_grad(set_to_none=True)
            return None
        if stepped[0] == c.serial:
            return None  # stepped already in this step (a second call must not step again)
        stepped[0] = c.serial
        optimizer.multigpu_skipped_step = False  # type: ignore[attr-defined]
        return step(*args, **kwargs)

    def gated_zero_grad(set_to_none: bool = True) -> None:
        if c.in_step and c.decided is None and (c.micro_index > 0 or c.step_waits):
            return  # between the micro-batches of one step: the gradients add up
        zero_grad(set_to_none=set_to_none)

    optimizer.step = gated_step  # type: ignore[method-assign]
    optimizer.zero_grad = gated_zero_grad  # type: ignore[method-assign]

"""PowerSGD on CPU tensors where CUDA is present, gradient norms by parts, what a loss averaged
over, pipeline stage names and gradient scaling, what DDP imports (see
``multigpu.torch_compat``)."""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Iterable
from typing import Any

import torch

from multigpu.torch_compat.version import TORCH_VERSION

DDP_IMPORTS = ("torch._dynamo",)
"""The private modules ``DistributedDataParallel(...)`` imports on its first construction (it asks
``torch._dynamo`` which reducer to use): 1.5-2 s of CPU per process, so a fork server that
starts many DDP workers (``multigpu.testing.run_distributed``) imports them once, beforehand."""


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


_NLL_NODES = ("NllLossBackward0", "NllLoss2DBackward0")


def mean_over_ignored(loss: torch.Tensor, depth: int = 4) -> tuple[int, int] | None:
    """(ignored targets, all targets) of a ``reduction="mean"`` NLL / cross-entropy within
    ``depth`` autograd nodes of ``loss`` whose targets include ``ignore_index``; None if none."""
    nodes: list[Any] = [loss.grad_fn]  # autograd nodes: their saved values are untyped
    for _ in range(depth):
        following: list[Any] = []
        for node in filter(None, nodes):
            if type(node).__name__ in _NLL_NODES and node._saved_reduction == 1:
                ignore = (node._saved_ignore_index + 2**63) % 2**64 - 2**63  # read back unsigned
                target = node._saved_target
                if ignored := int((target == ignore).sum()):
                    return ignored, target.numel()
            following.extend(next_node for next_node, _ in node.next_functions)
        nodes = following
    return None


def unflattened_name(name: str) -> str:
    """``name`` without ``torch.export``'s call suffixes: ``blocks.0@1.0@1.weight`` (a module's
    second call, traced into another pipeline stage) is ``blocks.0.0.weight``."""
    return ".".join(part.split("@", 1)[0] for part in name.split("."))


def unscaled_schedule_kwargs(schedule: type) -> dict[str, Any]:
    """Arguments that keep ``schedule`` from dividing the gradients by the micro-batches
    (``scale_grads=False``, 2.7+); a schedule without the option (before 2.7) never divides."""
    return {"scale_grads": False} if "scale_grads" in inspect.signature(schedule).parameters else {}


# ---- a GradScaler's record of one optimizer's step (replica groups) --------------------------
# GradScaler keeps, per optimizer, whether its gradients were unscaled and the infs it found
# (``_per_optimizer_states[id(optimizer)]``: ``stage`` and ``found_inf_per_device``), and has no
# public way to forget or set them. A replica group needs both (``multigpu.replicas.step_gate``):
# a share that is not its step's last was unscaled by a clip and is set aside (the next share's
# clip unscales again), and after the groups sum their gradients every group must skip or step
# alike, whatever inf its own share held.


def scaler_unscaled(scaler: Any, optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``scaler.unscale_(optimizer)`` ran since its last ``update()``."""
    from torch.amp.grad_scaler import OptState

    state = scaler._per_optimizer_states.get(id(optimizer))
    return state is not None and state["stage"] is OptState.UNSCALED


def scaler_forget_unscale(scaler: Any, optimizer: torch.optim.Optimizer) -> None:
    """Forget that ``optimizer``'s gradients were unscaled (they were set aside): the next
    ``unscale_`` of it is allowed again."""
    from torch.amp.grad_scaler import _refresh_per_optimizer_state

    scaler._per_optimizer_states[id(optimizer)] = _refresh_per_optimizer_state()


def scaler_set_found_inf(scaler: Any, optimizer: torch.optim.Optimizer, found: bool) -> None:
    """Make the infs ``scaler`` found in ``optimizer``'s unscaled gradients ``found`` on every
    device (``scaler.step`` then skips or steps by it, ``update`` backs off or grows by it)."""
    for flag in scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"].values():
        flag.fill_(1.0 if found else 0.0)

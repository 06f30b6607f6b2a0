"""The objects a checkpoint holds: what kind each is, its state on the CPU, and loading it back.

Anything with ``state_dict`` / ``load_state_dict`` can be tracked. Models and optimizers are
saved by the strategy (``snapshot``); the other objects' states go to the CPU here, so a
checkpoint loads on any machine (a module tracked per rank is saved unwrapped: no ``module.`` /
``_orig_mod.``). For an asynchronous save the state is also *copied* (``clone=True``): training
may change the live tensors while a background thread writes the copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from multigpu.errors import CheckpointError, DataError, UsageError
from multigpu.runtime.wrappers import unwrap_module


def kind_of(obj: Any) -> str:
    """The manifest's kind of a tracked object."""
    if isinstance(obj, nn.Module):
        return "module"
    if isinstance(obj, torch.optim.Optimizer):
        return "optimizer"
    if isinstance(obj, torch.optim.lr_scheduler.LRScheduler):
        return "scheduler"
    if isinstance(obj, torch.amp.GradScaler):
        return "scaler"
    # multigpu's DistributedLoader or StreamLoader (duck-typed: checkpoint/ sits beside data/,
    # not above it).
    if hasattr(obj, "global_batch_size") and (hasattr(obj, "sampler") or hasattr(obj, "stream")):
        return "loader"
    if _stateful(obj):
        return "object"
    return "value"  # a plain value of ctx.save's state: saved as it is


def _stateful(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


def epoch_of(objects: Mapping[str, Any]) -> int | None:
    """The epoch of the first tracked loader, for the manifest (None: no loader)."""
    loaders = [o for o in objects.values() if kind_of(o) == "loader"]
    return int(loaders[0].epoch) if loaders else None


def check_trackable(name: str, obj: Any, taken: Mapping[str, Any]) -> None:
    """Raise UsageError unless ``obj`` can be tracked under ``name``."""
    if not name.isidentifier():
        raise UsageError(f"checkpoint name {name!r} is not an identifier; use e.g. model=model")
    if name in taken:
        raise UsageError(
            f"checkpoint name {name!r} is already tracked ({type(taken[name]).__name__}); "
            "give each object its own name"
        )
    if not _stateful(obj):
        raise UsageError(
            f"checkpoint object {name}={type(obj).__name__} has no state_dict()/load_state_dict(); "
            "expected a module, optimizer, scheduler, loader or an object that has both"
        )


def to_cpu(value: Any, *, clone: bool) -> Any:
    """``value`` with every tensor on the CPU (copied when ``clone``), containers rebuilt.

    Example:
        >>> t = torch.ones(2); c = to_cpu({"a": [t]}, clone=True)["a"][0]
        >>> _ = c.add_(1); float(t[0])
        1.0
    """
    if isinstance(value, torch.Tensor):
        out = value.detach()
        if out.device.type != "cpu":
            return out.to("cpu")  # a copy already
        return out.clone() if clone else out
    if isinstance(value, dict):
        return type(value)((k, to_cpu(v, clone=clone)) for k, v in value.items())
    if isinstance(value, list):
        return [to_cpu(v, clone=clone) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(to_cpu(v, clone=clone) for v in value)
    return value


def state_of(obj: Any, *, clone: bool) -> dict[str, Any] | Any:
    """The CPU state of one tracked object (a module's is that of the unwrapped module)."""
    if kind_of(obj) == "value":
        return to_cpu(obj, clone=clone)
    if isinstance(obj, nn.Module):
        obj = unwrap_module(obj)
    return to_cpu(obj.state_dict(), clone=clone)


def load_into(name: str, obj: Any, state: Any) -> None:
    """Load ``state`` into ``obj``; a mismatch is a CheckpointError naming ``name``."""
    try:
        if isinstance(obj, nn.Module):
            unwrap_module(obj).load_state_dict(state)  # strict: every key must match
        else:
            obj.load_state_dict(state)
    except DataError:
        raise  # the data files changed since the save: it names the file, and is the user's
    except (RuntimeError, KeyError, ValueError, TypeError, UsageError) as e:
        raise CheckpointError(
            f"checkpoint object {name!r} ({type(obj).__name__}) does not fit the saved state: {e}"
        ) from e

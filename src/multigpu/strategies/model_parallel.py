"""The tutorials' model parallel in one process: stages of a model on several devices.

PyTorch's "Single-Machine Model Parallel Best Practices" puts ``net1`` on ``cuda:0`` and
``net2`` on ``cuda:1`` and moves the activations in ``forward`` by hand (``x.to('cuda:1')``).
``place_stages`` does the same to an unchanged single-device model, named the way
``PipelineStrategy`` names its cut (``split_points``: the module each later stage begins with):
each module goes to its stage's device and a forward pre-hook moves its inputs there, so the
model's own ``forward`` needs no device code (the way Hugging Face Accelerate's ``device_map``
places a model). Only one device computes at a time; ``PipelineStrategy`` runs the same cut on
one process per stage with micro-batches in flight (docs/tensor-parallel.md shows the move).

Stages follow the order modules are registered in (``named_modules``), which is their order in
``forward`` for the usual models (layers defined in the order they run).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from multigpu.errors import UsageError
from multigpu.runtime.device import move_to_device


def stage_of(model: nn.Module, split_points: Sequence[str]) -> dict[str, int]:
    """The stage of every named submodule: 0 before the first split point, ``i`` from the
    ``i``-th on (in registration order).

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1))
        >>> stage_of(net, ["2"])
        {'': 0, '0': 0, '1': 0, '2': 1}
    """
    if isinstance(split_points, str) or not all(isinstance(p, str) for p in split_points):
        raise UsageError(
            f"split_points={split_points!r}: expected a list of module names, e.g. ['net2']"
        )
    names = [name for name, _ in model.named_modules()]
    missing = [p for p in split_points if p not in names or p == ""]
    if missing:
        raise UsageError(
            f"split_points {missing} name no submodule of {type(model).__name__}; use names "
            f"from model.named_modules(), e.g. {[n for n in names if n][:6]}"
        )
    order = [names.index(p) for p in split_points]
    if order != sorted(set(order)):
        raise UsageError(
            f"split_points={list(split_points)!r} are not in the model's order (or repeat one); "
            f"give them as the modules run: {sorted(split_points, key=names.index)}"
        )
    stages: dict[str, int] = {}
    stage = 0
    for name in names:
        if name in split_points:
            stage = split_points.index(name) + 1
        stages[name] = stage
    return stages


def place_stages(
    model: nn.Module, split_points: Sequence[str], devices: Sequence[str | torch.device]
) -> nn.Module:
    """Place ``model``'s stages on ``devices`` and move activations between them; return it.

    Args:
        model: a plain single-device model (its ``forward`` unchanged).
        split_points: the modules each stage after the first begins with, as
            ``PipelineStrategy(split_points=...)`` takes them (e.g. ``["net2"]``).
        devices: one device per stage, e.g. ``["cuda:0", "cuda:1"]`` (``["cpu", "cpu"]`` runs
            the same code without GPUs). The output is on ``devices[-1]``: move the labels there.

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1))
        >>> net = place_stages(net, ["2"], ["cpu", "cpu"])
        >>> net(torch.ones(1, 2)).device
        device(type='cpu')
    """
    if isinstance(devices, str) or len(devices) != len(split_points) + 1:
        raise UsageError(
            f"devices={devices!r} for {len(split_points) + 1} stages (split_points="
            f"{list(split_points)!r}); give one device per stage, e.g. "
            f"{['cuda:' + str(i) for i in range(len(split_points) + 1)]}"
        )
    targets = [torch.device(d) for d in devices]
    stages = stage_of(model, split_points)
    for name, module in _whole_units(model, stages):
        device = targets[stages[name]]
        module.to(device)
        module.register_forward_pre_hook(functools.partial(_move_inputs, device), with_kwargs=True)
    return model


def _whole_units(model: nn.Module, stages: dict[str, int]) -> list[tuple[str, nn.Module]]:
    """The outermost modules whose whole subtree is in one stage (each is placed as one)."""
    units: list[tuple[str, nn.Module]] = []

    def visit(prefix: str, module: nn.Module) -> None:
        subtree = {s for n, s in stages.items() if not prefix or f"{n}.".startswith(f"{prefix}.")}
        if len(subtree) == 1:
            units.append((prefix, module))
            return
        if [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
            raise UsageError(
                f"module {prefix or '<root>'!r} ({type(module).__name__}) has parameters of its "
                "own but its submodules span several stages; split at whole modules"
            )
        for name, child in module.named_children():
            visit(f"{prefix}.{name}" if prefix else name, child)

    visit("", model)
    return units


def _move_inputs(
    device: torch.device, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    # The tutorial's x.to("cuda:1"): autograd carries the gradient back across the copy.
    return move_to_device(args, device), move_to_device(kwargs, device)

"""Models' and optimizers' state for the DCP part of a checkpoint, and putting it back.

The state is what the *strategy* produces (plain tensors, or this rank's shards under FSDP),
optimizers keyed by parameter names. The strategy is reached through ``StateAdapter``
(``multigpu.strategies.Strategy`` is one), so nothing here knows DDP from FSDP.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from multigpu.checkpoint.native.objects import kind_of
from multigpu.checkpoint.native.sharded import check_fits, first_line, load_sharded, read_metadata
from multigpu.errors import CheckpointError, CheckpointMismatchError, UsageError
from multigpu.runtime import dist

SHARDED_KINDS = frozenset({"module", "optimizer"})
"""Kinds whose state goes to the DCP part."""


class StateSource(Protocol):
    """How the strategy in use produces model and optimizer state (what a save needs)."""

    def model_state(self, module: nn.Module) -> dict[str, Any]: ...

    def optimizer_state(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, *, initialise: bool = False
    ) -> dict[str, Any]: ...


class StateAdapter(StateSource, Protocol):
    """How the strategy in use produces and loads model and optimizer state."""

    def load_model_state(self, module: nn.Module, saved: Mapping[str, Any]) -> None: ...

    def load_optimizer_state(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, saved: Mapping[str, Any]
    ) -> None: ...


def pair_optimizers(objects: Mapping[str, Any]) -> dict[str, nn.Module]:
    """``{optimizer name: the tracked module whose parameters it steps}``: optimizer state is
    saved by parameter *name*, which only the model knows."""
    modules = [(n, o) for n, o in objects.items() if isinstance(o, nn.Module)]
    owners = {id(p): n for n, m in modules for p in m.parameters()}
    pairs: dict[str, nn.Module] = {}
    for name, obj in objects.items():
        if not isinstance(obj, torch.optim.Optimizer):
            continue
        found = {owners.get(id(p)) for g in obj.param_groups for p in g["params"]}
        if None in found or len(found) != 1:
            tracked = ", ".join(n for n, _ in modules) or "none"
            raise UsageError(
                f"checkpoint object {name!r} ({type(obj).__name__}) steps parameters that are "
                f"not all in one tracked model (tracked models: {tracked}); track the model it "
                "optimizes too (e.g. model=model): optimizer state is saved by parameter name"
            )
        owner = found.pop()
        assert owner is not None
        pairs[name] = dict(modules)[owner]
    return pairs


def sharded_state(
    objects: Mapping[str, Any], adapter: StateSource
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The DCP state of the tracked models and optimizers, and what the manifest says of each."""
    pairs = pair_optimizers(objects)
    state: dict[str, Any] = {}
    info: dict[str, dict[str, Any]] = {}
    for name, obj in objects.items():
        kind = kind_of(obj)
        if kind == "module":
            state[name] = adapter.model_state(obj)
            info[name] = {"kind": kind, "storage": "dcp"}
            tied = _tied_names(adapter, obj)
            if tied:  # held once, under the first name: what readers put back under the rest
                info[name]["tied"] = tied
        elif kind == "optimizer":
            state[name] = adapter.optimizer_state(pairs[name], obj)
            info[name] = {"kind": kind, "storage": "dcp", "has_state": bool(state[name]["state"])}
    return state, info


def _tied_names(adapter: StateSource, module: nn.Module) -> dict[str, str]:
    """``{later name: first name}`` of the tensors ``module`` holds under several names (the
    strategy's answer: a pipeline stage holds part of the model; a conversion knows none)."""
    tied = getattr(adapter, "tied_names", None)
    return dict(tied(module)) if callable(tied) else {}


def _shape(value: Any) -> tuple[int, ...] | None:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


def expected_keys(state: Mapping[str, Any]) -> dict[str, tuple[int, ...] | None]:
    """The flattened DCP keys of ``state`` (as ``sharded_state`` builds it), with the tensors'
    global shapes (None: not a tensor, e.g. an optimizer's hyperparameters)."""
    keys: dict[str, tuple[int, ...] | None] = {}
    for name, value in state.items():
        if "param_groups" in value and "state" in value:  # an optimizer
            for fqn, stats in value["state"].items():
                for stat, tensor in stats.items():
                    keys[f"{name}.state.{fqn}.{stat}"] = _shape(tensor)
            for index, group in enumerate(value["param_groups"]):
                keys.update({f"{name}.param_groups.{index}.{k}": None for k in group})
        else:
            keys.update({f"{name}.{fqn}": _shape(t) for fqn, t in value.items()})
    return keys


def _check_group_layout(saved: Mapping[str, Any], targets: Mapping[str, Any], path: Path) -> None:
    """Refuse, in one line, an optimizer whose param groups were saved per pipeline stage (each
    process its own under ``param_groups.stages_0_1``, as earlier pipelines did): they name
    only their stage's parameters, so no run can map them to its own."""
    for name, value in targets.items():
        base = f"{name}.param_groups."
        found = sorted(
            {k[len(base) :].split(".")[0] for k in saved if k.startswith(base + "stages_")}
        )
        if found and "param_groups" in value:
            raise CheckpointMismatchError(
                f"checkpoint {path} holds the param groups of optimizer {name!r} per pipeline "
                f"stage ({', '.join(found)}), as an earlier multigpu saved them, which no run "
                "can map to its parameters; resume the model alone (track only the model) and "
                "start the optimizer afresh"
            )


def restore_sharded(
    path: Path,
    objects: Mapping[str, Any],
    saved_objects: Mapping[str, Mapping[str, Any]],
    adapter: StateAdapter,
) -> None:
    """Load the DCP part of checkpoint ``path`` into the tracked models and optimizers
    (collective); ``saved_objects`` is the manifest's ``objects``."""
    pairs = pair_optimizers(objects)
    targets: dict[str, Any] = {}
    for name, obj in objects.items():
        kind = kind_of(obj)
        if kind == "module":
            targets[name] = adapter.model_state(obj)
        elif kind == "optimizer":
            has_state = bool(saved_objects.get(name, {}).get("has_state", True))
            targets[name] = adapter.optimizer_state(pairs[name], obj, initialise=has_state)
            if not has_state:
                targets[name]["state"] = {}
    if not targets:
        return
    with _agreed():  # a pipeline stage checks its own keys: every rank must hear a refusal
        metadata = read_metadata(path)
        _check_group_layout(metadata.state_dict_metadata, targets, path)
        check_fits(metadata, expected_keys(targets), path)
    try:
        load_sharded(targets, path)
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"cannot load the sharded state of {path}: {first_line(e)}") from e
    with _agreed():
        for name, obj in objects.items():  # every one is in targets: a module or an optimizer
            try:
                if isinstance(obj, nn.Module):
                    adapter.load_model_state(obj, targets[name])
                elif isinstance(obj, torch.optim.Optimizer):
                    adapter.load_optimizer_state(pairs[name], obj, targets[name])
            except CheckpointError:
                raise
            except (RuntimeError, KeyError, ValueError, TypeError) as e:
                raise CheckpointMismatchError(
                    f"checkpoint object {name!r} ({type(obj).__name__}) does not fit the saved "
                    f"state: {first_line(e)}"
                ) from e


@contextlib.contextmanager
def _agreed() -> Iterator[None]:
    """Raise the first rank's ``CheckpointError`` of the block on every rank (collective): a
    rank that refused alone would leave the others waiting in the load's collectives."""
    error: CheckpointError | None = None
    try:
        yield
    except CheckpointError as e:
        error = e
    said = [e for e in dist.gather_objects_small(error) if e is not None]
    if said:  # the same line on every rank; the rank that said it keeps its own traceback
        first = said[0]
        if error is not None and (type(error), str(error)) == (type(first), str(first)):
            raise error
        raise first from error

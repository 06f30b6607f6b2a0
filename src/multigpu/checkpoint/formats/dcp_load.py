"""``ctx.load`` of a plain DCP checkpoint: one written by ``torch.distributed.checkpoint.save``.

The names asked for are the checkpoint's top-level objects (``dcp_objects``): a nested
``dcp.save({"model": ..., "optim": ...})`` has ``model`` and ``optim``; a flat
``dcp.save(model.state_dict())`` or a torchtitan step directory has its top-level tensors as
``model``. Models load resharded to this run's strategy, as our own checkpoints do; an optimizer
loads when it was saved keyed by parameter names (``get_optimizer_state_dict``, the layout
multigpu writes), not torchtitan's flattened one or a plain ``optimizer.state_dict()``;
plain values are replaced, other objects get ``load_state_dict``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

from multigpu.checkpoint.formats.dcp_objects import DcpObject, listing, objects_of
from multigpu.checkpoint.native.objects import kind_of, load_into
from multigpu.checkpoint.native.sharded import check_fits, load_sharded, read_complete, read_whole
from multigpu.checkpoint.native.snapshot import StateAdapter, expected_keys, pair_optimizers
from multigpu.errors import CheckpointMismatchError

log = logging.getLogger(__name__)


def _optimizer_fits(name: str, saved: DcpObject, state: Mapping[str, Any], path: Path) -> None:
    """Refuse an optimizer state saved in another layout than the one ``state`` is in."""
    wanted = [f"param_groups.{i}.{k}" for i, g in enumerate(state["param_groups"]) for k in g]
    absent = [k for k in wanted if k not in saved.keys]
    if absent:
        raise CheckpointMismatchError(
            f"the optimizer state {name!r} of {path} is not laid out as torch's "
            f"get_optimizer_state_dict lays it out (no {absent[0]}; torchtitan flattens its "
            "optimizer, a plain optimizer.state_dict() keys it by position): load the model "
            "alone and start the optimizer afresh"
        )


def load_dcp(path: Path, state: MutableMapping[str, Any], adapter: StateAdapter) -> dict[str, Any]:
    """Fill ``state`` from the plain DCP checkpoint ``path`` (collective); return its objects
    holding no tensors that ``state`` did not ask for (torchtitan's ``train_state``...)."""
    metadata = read_complete(path)
    objects = objects_of(metadata)
    missing = sorted(n for n in state if n not in objects)
    if missing:
        raise CheckpointMismatchError(
            f"the DCP checkpoint {path} has no {missing}; it holds {listing(objects)}: ask for "
            "those names"
        )
    pairs = pair_optimizers(state)
    targets: dict[str, Any] = {}
    expected: dict[str, tuple[int, ...] | None] = {}
    held: dict[str, Any] = {}
    for name, obj in state.items():
        saved, kind = objects[name], kind_of(obj)
        if kind in ("module", "optimizer") and saved.kind != (
            "model" if kind == "module" else kind
        ):
            raise CheckpointMismatchError(
                f"{name!r} of {path} is {saved.describe()}, but state gives a {kind} for it; it "
                f"holds {listing(objects)}"
            )
        if kind == "module":
            held[name] = adapter.model_state(obj)
        elif kind == "optimizer":
            held[name] = adapter.optimizer_state(pairs[name], obj, initialise=True)
            _optimizer_fits(name, saved, held[name], path)
        else:
            continue
        if saved.top_level:  # the tensors saved at the top level: their keys are bare names
            targets.update(held[name])
            expected.update({k: tuple(v.shape) for k, v in held[name].items()})
        else:
            targets[name] = held[name]
            expected.update(expected_keys({name: held[name]}))
    if targets:
        check_fits(metadata, expected, path)
        load_sharded(targets, path, metadata=metadata)
    for name, obj in state.items():
        if name in held:
            if kind_of(obj) == "module":
                adapter.load_model_state(obj, held[name])
            else:
                adapter.load_optimizer_state(pairs[name], obj, held[name])
    others = [n for n in state if n not in held]
    small = [n for n, o in objects.items() if o.kind == "values" and n not in state]
    wanted = set(others) | set(small)
    read = read_whole(path, wanted, metadata=metadata) if wanted else {}
    for name in others:
        if kind_of(state[name]) == "value":
            state[name] = read[name]
        else:
            load_into(name, state[name], read[name])
    log.info("loaded %s from the DCP checkpoint %s", ", ".join(state), path)
    return {n: read[n] for n in small}

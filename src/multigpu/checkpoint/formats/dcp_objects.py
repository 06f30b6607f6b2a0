"""The objects of any DCP checkpoint, from its index alone: what each is and which is the model.

``torch.distributed.checkpoint.save`` flattens the state it is given: ``{"model": {"fc.weight":
t}}`` is stored under the key ``model.fc.weight`` with the path ``("model", "fc.weight")`` in the
index's ``planner_data``. The first element of a path names a top-level object; the tensors saved
at the top level itself (a flat ``dcp.save(model.state_dict())``, or torchtitan's step
directories, whose model keys sit beside ``optimizer``, ``lr_scheduler``, ``dataloader`` and
``train_state``) together form one object, called ``model`` (``.`` when the checkpoint also has
an object called ``model``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from multigpu.checkpoint.native.sharded import load_sharded
from multigpu.errors import UsageError

MODEL_NAMES = ("model", "state_dict", "model_state_dict", "module", "net")
"""Object names that say "the model", preferred in this order when several objects could be."""

TORCHTITAN_NAMES = frozenset({"optimizer", "lr_scheduler", "dataloader", "train_state"})
"""What torchtitan saves beside its model's top-level tensors."""

_PARAM_GROUPS = "param_groups"


@dataclass
class DcpObject:
    """One top-level object of a DCP checkpoint, as its index describes it."""

    name: str
    """Its name in the checkpoint (``model`` or ``.`` for the top-level tensors)."""
    top_level: bool = False
    """Whether it is the tensors saved at the top level (no name of their own in the index)."""
    keys: dict[str, str] = field(default_factory=dict)
    """{key inside the object (``fc.weight``, ``state.fc.weight.exp_avg``): key in the index}."""
    tensors: dict[str, TensorStorageMetadata] = field(default_factory=dict)
    """{key inside the object: the tensor's global size, dtype and stored pieces}."""
    optimizer_like: bool = False
    """Whether its keys are an optimizer's (``state`` / ``param_groups`` first)."""

    @property
    def values(self) -> int:
        """How many of its entries are not tensors (hyperparameters, counters, bytes)."""
        return len(self.keys) - len(self.tensors)

    @property
    def kind(self) -> str:
        """``model`` (tensors only: a state dict), ``optimizer``, ``values`` (no tensor), or
        ``mixed``."""
        if self.optimizer_like:
            return "optimizer"
        if not self.tensors:
            return "values"
        others = [k for k in self.keys if k not in self.tensors]
        return "model" if all(k.endswith("_extra_state") for k in others) else "mixed"

    @property
    def numel(self) -> int:
        """Values in its tensors, all together."""
        return sum(_numel(info) for info in self.tensors.values())

    @property
    def bytes(self) -> int:
        """Bytes of its tensors, all together."""
        return sum(_numel(info) * info.properties.dtype.itemsize for info in self.tensors.values())

    def describe(self) -> str:
        """One phrase: ``optim (optimizer: 12 tensors, 11 values)``."""
        counts = [f"{len(self.tensors)} tensors"] if self.tensors else []
        counts += [f"{self.values} values"] if self.values else []
        where = "; the top-level tensors" if self.top_level else ""
        return f"{self.name} ({self.kind}: {', '.join(counts) or 'empty'}{where})"


def _numel(info: TensorStorageMetadata) -> int:
    n = 1
    for d in info.size:
        n *= int(d)
    return n


def objects_of(metadata: Metadata) -> dict[str, DcpObject]:
    """The top-level objects of a DCP checkpoint's index, in the order it lists them.

    Example:
        >>> from torch.distributed.checkpoint.metadata import BytesStorageMetadata as Bytes
        >>> from torch.distributed.checkpoint.metadata import TensorProperties
        >>> t = TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size([2]), [])
        >>> lr = ("opt", "param_groups", 0, "lr")
        >>> index = Metadata({"w": t, "opt.param_groups.0.lr": Bytes()},
        ...                  planner_data={"w": ("w",), "opt.param_groups.0.lr": lr})
        >>> for found in objects_of(index).values():
        ...     print(found.describe())
        model (model: 1 tensors; the top-level tensors)
        opt (optimizer: 1 values)
    """
    paths: Mapping[str, Any] = metadata.planner_data or {}
    nested: dict[str, DcpObject] = {}
    top: DcpObject | None = None
    for fqn, info in metadata.state_dict_metadata.items():
        path = tuple(str(p) for p in paths.get(fqn, (fqn,)))
        tensor = isinstance(info, TensorStorageMetadata)
        if len(path) == 1 and tensor:
            top = top or DcpObject(name=".", top_level=True)
            entry, inner = top, fqn
        else:
            entry = nested.setdefault(path[0], DcpObject(name=path[0]))
            inner = ".".join(path[1:]) if len(path) > 1 else ""
            # torch's optimizer state dict has param_groups (nested, or flattened by
            # torchtitan into "param_groups.<fqn>.<name>"); a model has no such key.
            if len(path) > 1 and path[1].split(".", 1)[0] == _PARAM_GROUPS:
                entry.optimizer_like = True
        entry.keys[inner] = fqn
        if isinstance(info, TensorStorageMetadata):
            entry.tensors[inner] = info
    found: dict[str, DcpObject] = {}
    if top is not None:
        top.name = "." if "model" in nested else "model"
        found[top.name] = top
    found.update(nested)
    return found


def is_torchtitan(objects: Mapping[str, DcpObject]) -> bool:
    """Whether the objects are laid out as a torchtitan step directory is."""
    return any(o.top_level for o in objects.values()) and bool(TORCHTITAN_NAMES & set(objects))


def listing(objects: Mapping[str, DcpObject]) -> str:
    """What a checkpoint holds, for a message: ``model (model: 4 tensors), step (values: ...)``."""
    return ", ".join(o.describe() for o in objects.values()) or "nothing"


def choose_model(objects: Mapping[str, DcpObject], key: str | None, where: Path) -> DcpObject:
    """The object holding the model: ``key``'s, else the only model-like one, else the one with
    the usual name (``MODEL_NAMES``); a UsageError listing what there is otherwise."""
    if key is not None:
        if key not in objects:
            raise UsageError(
                f"key={key!r} is not in the DCP checkpoint {where}; it holds {listing(objects)}: "
                "pass one of those names"
            )
        chosen = objects[key]
        if chosen.kind != "model":
            names = [o.name for o in objects.values() if o.kind == "model"]
            raise UsageError(
                f"key={key!r} of {where} is {chosen.describe()}, not a model's state dict; pass "
                f"key=NAME naming one ({', '.join(names) or 'it holds none'})"
            )
        return chosen
    models = [o for o in objects.values() if o.kind == "model"]
    if len(models) > 1:
        usual = [objects[n] for n in MODEL_NAMES if n in objects and objects[n] in models]
        models = usual[:1] or models
    if len(models) != 1:
        raise UsageError(
            f"the DCP checkpoint {where} holds {len(models)} model state dicts among "
            f"{listing(objects)}; pass key=NAME (CLI: --key NAME) to choose one"
        )
    return models[0]


def read_object(
    directory: str | os.PathLike[str],
    chosen: DcpObject,
    *,
    metadata: Metadata,
    trust: bool = False,
) -> dict[str, Any]:
    """``chosen``'s entries, whole, on the CPU, in this process: {key inside it: value}."""
    targets: dict[str, Any] = {
        fqn: torch.empty(tuple(chosen.tensors[inner].size), dtype=_dtype(chosen, inner))
        if inner in chosen.tensors
        else None
        for inner, fqn in chosen.keys.items()
    }
    load_sharded(targets, Path(directory), trust=trust, alone=True, metadata=metadata)
    return {inner: targets[fqn] for inner, fqn in chosen.keys.items()}


def _dtype(chosen: DcpObject, inner: str) -> torch.dtype:
    return chosen.tensors[inner].properties.dtype


def stream_tensors(
    directory: str | os.PathLike[str],
    keys: Mapping[str, str],
    *,
    metadata: Metadata,
    trust: bool = False,
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, whole tensor)`` for each ``{name: key in the index}`` of ``keys``, one at a time:
    only one tensor is in memory here at once (its pieces gathered from every shard file)."""
    infos = metadata.state_dict_metadata
    for name, fqn in keys.items():
        info = infos[fqn]
        assert isinstance(info, TensorStorageMetadata)
        target = {fqn: torch.empty(tuple(info.size), dtype=info.properties.dtype)}
        load_sharded(target, Path(directory), trust=trust, alone=True, metadata=metadata)
        yield name, target[fqn]

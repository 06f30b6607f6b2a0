"""The model's state dict inside what a checkpoint file holds: plain, nested, or ours.

A ``torch.save`` file may hold a plain state dict, one nested under a usual key
(``NESTED_KEYS``), a pickled module, or a multigpu checkpoint's ``state.pt`` (whose models may
be in the checkpoint's sharded part: read whole from its DCP files). ``extract_state_dict``
finds the model in any of them, or says in one line which ``key`` to pass.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from multigpu.checkpoint.formats.base import ModelRead, ModelSource
from multigpu.checkpoint.formats.dcp_objects import DcpObject, objects_of, stream_tensors
from multigpu.checkpoint.formats.keys import strip_common_prefixes
from multigpu.checkpoint.native.layout import FORMAT, read_manifest
from multigpu.checkpoint.native.sharded import read_metadata, read_whole
from multigpu.errors import CheckpointError, UsageError
from multigpu.runtime.wrappers import with_tied

NESTED_KEYS = ("state_dict", "model_state_dict", "model", "module", "net")
"""Where training scripts usually put the model's state dict inside a checkpoint dict."""


def _is_state_dict(obj: Any) -> bool:
    # A module's get_extra_state() may be any object; everything else in a state dict is a tensor.
    return (
        isinstance(obj, Mapping)
        and bool(obj)
        and all(
            isinstance(k, str) and (isinstance(v, torch.Tensor) or k.endswith("_extra_state"))
            for k, v in obj.items()
        )
    )


def _describe(obj: Any) -> str:
    if isinstance(obj, Mapping):
        return f"a dict with keys {sorted(str(k) for k in obj)[:8]}"
    return f"a {type(obj).__name__}"


def _as_state_dict(obj: Any, where: str) -> Mapping[str, Any]:
    if isinstance(obj, nn.Module):  # torch.save(model): only readable with trust=True
        return obj.state_dict()
    if _is_state_dict(obj):
        return obj
    raise UsageError(
        f"{where} holds {_describe(obj)}, not a model state dict (names -> tensors); pass "
        "key=NAME (CLI: --key NAME) naming the model's entry"
    )


_NOT_WEIGHTS = frozenset({"optimizer", "scheduler", "scaler", "loader", "value"})
"""Kinds of checkpoint objects that never hold a model's weights."""


@dataclass(frozen=True, kw_only=True)
class OurModel:
    """Which object of a multigpu checkpoint holds the model, and where it is stored."""

    directory: Path
    """The checkpoint (``step-*`` or ``ctx.save``) directory."""
    key: str
    """The object's name."""
    storage: str
    """``dcp`` (the sharded part), ``state`` (whole in ``state.pt``) or ``rank`` (per rank)."""
    source: str
    """Where the weights were found, for a ``LoadReport``."""
    where: str
    """The object, for a message."""


def choose_ours(obj: Mapping[str, Any], state_file: Path, key: str | None) -> OurModel:
    """The model of a multigpu checkpoint whose ``state.pt`` holds ``obj``: ``key``'s object, or
    the one module (``model`` among several); a UsageError saying what there is otherwise."""
    try:
        manifest = read_manifest(state_file.parent)
    except CheckpointError:  # a state.pt away from its manifest: it describes itself
        manifest = {}
    described: dict[str, Any] = manifest.get("objects", {})
    small, step = obj["objects"], obj.get("step")
    names = list(described) or list(small)
    kinds = {n: described.get(n, {}).get("kind", "?") for n in names}
    if key is None:
        modules = [n for n in names if kinds[n] == "module"] or [
            n for n, v in small.items() if _is_state_dict(v)
        ]
        if "model" in modules:  # the name Checkpointer's users give the model they train
            modules = ["model"]
        if len(modules) != 1:
            listed = ", ".join(f"{n} ({kinds[n]})" for n in names) or "nothing"
            raise UsageError(
                f"{state_file.parent} holds {len(modules)} models among {listed}; pass key=NAME "
                "(CLI: --key NAME) to choose one"
            )
        key = modules[0]
    if key not in names:
        raise UsageError(
            f"key={key!r} is not in {state_file.parent}; it holds "
            + ", ".join(f"{n} ({kinds[n]})" for n in names)
            + ": pass one of those (a module for weights)"
        )
    if kinds[key] in _NOT_WEIGHTS:  # refused before a large optimizer state is read
        models = [n for n in names if kinds[n] == "module"]
        raise UsageError(
            f"key={key!r} is the {kinds[key]} of {state_file.parent}, not a model; pass "
            f"key=NAME naming a module ({', '.join(models) or 'it holds none'})"
        )
    source = f"multigpu checkpoint step {step}, object {key!r}"
    storage = described.get(key, {}).get("storage", "state")
    if storage == "dcp":
        strategy = manifest.get("strategy", {}).get("strategy", "?")
        source += f" (sharded: {manifest.get('world_size')} rank(s), {strategy})"
    return OurModel(
        directory=state_file.parent,
        key=key,
        storage=storage,
        source=source,
        where=f"object {key!r} (kind {kinds[key]}) of {state_file.parent}",
    )


def _from_our_checkpoint(
    obj: Mapping[str, Any], state_file: Path, key: str | None, trust: bool = False
) -> tuple[Mapping[str, Any], str]:
    """The model of a multigpu checkpoint: from ``state.pt`` (format 1, small objects) or, for
    what the manifest says is in the DCP part (format 2), read whole from the shards."""
    chosen = choose_ours(obj, state_file, key)
    if chosen.storage == "dcp":
        saved = read_whole(chosen.directory, {chosen.key}, trust=trust).get(chosen.key, {})
        described = read_manifest(chosen.directory).get("objects", {}).get(chosen.key, {})
        saved = with_tied(saved, described.get("tied", {}))  # one tensor, under each name
        return _as_state_dict(saved, chosen.where), chosen.source
    if chosen.key not in obj["objects"]:  # saved per rank (rank-XXXXX.pt): no one model state
        raise UsageError(
            f"{chosen.where} is saved per rank ({chosen.storage}), not as one model state dict; "
            "pass key=NAME naming a model"
        )
    return _as_state_dict(obj["objects"][chosen.key], chosen.where), chosen.source


def extract_state_dict(
    obj: Any, state_file: Path, key: str | None, trust: bool = False
) -> tuple[Mapping[str, Any], str]:
    """Find the model's state dict inside a loaded object; return it and where it was.

    Example:
        >>> extract_state_dict({"epoch": 3, "state_dict": {"w": torch.ones(1)}}, Path("x"), None)
        ({'w': tensor([1.])}, "dict key 'state_dict'")
    """
    if isinstance(obj, Mapping) and obj.get("format") == FORMAT and "objects" in obj:
        return _from_our_checkpoint(obj, state_file, key, trust)
    if key is not None:
        if not isinstance(obj, Mapping) or key not in obj:
            raise UsageError(
                f"key={key!r} is not in {state_file}, which holds {_describe(obj)}; pass one of "
                "its keys"
            )
        return _as_state_dict(obj[key], f"key {key!r} of {state_file}"), f"dict key {key!r}"
    if isinstance(obj, nn.Module):
        return obj.state_dict(), f"pickled {type(obj).__name__} module"
    if _is_state_dict(obj):
        return obj, "plain state dict"
    if isinstance(obj, Mapping):
        usual = [k for k in NESTED_KEYS if _is_state_dict(obj.get(k))]
        usual = usual or [k for k in NESTED_KEYS if isinstance(obj.get(k), nn.Module)]
        if len(usual) == 1:
            return _as_state_dict(obj[usual[0]], ""), f"dict key {usual[0]!r}"
        found = usual or [str(k) for k, v in obj.items() if _is_state_dict(v)]
        raise UsageError(
            f"{state_file} holds {_describe(obj)} with state dicts under {found or 'no key'}; "
            "pass key=NAME (CLI: --key NAME) to choose one"
        )
    raise UsageError(
        f"{state_file} holds {_describe(obj)}, not a state dict; expected a dict of tensors, "
        "a checkpoint dict holding one, or a multigpu checkpoint"
    )


def is_ours(obj: Any) -> bool:
    """Whether a loaded file is a multigpu checkpoint's ``state.pt``."""
    return isinstance(obj, Mapping) and obj.get("format") == FORMAT and "objects" in obj


def read_loaded(
    obj: Any, file: Path, key: str | None, trust: bool, mapped: Mapping[str, str]
) -> ModelRead:
    """``read_model`` of a loaded ``torch.save`` file (a multigpu ``state.pt`` among them): the
    report names a multigpu checkpoint's directory, else the file."""
    found, source = extract_state_dict(obj, file, key, trust)
    return ModelRead(
        state=found,
        path=file.parent if is_ours(obj) else file,
        source=source,
        devices_mapped=mapped,
        trusted=trust,
    )


def source_of_loaded(obj: Any, file: Path, key: str | None, trust: bool) -> ModelSource:
    """``open_model`` of a loaded ``torch.save`` file: a multigpu checkpoint's sharded model is
    streamed from its DCP files, anything else is handed out from memory."""
    if is_ours(obj):
        ours = choose_ours(obj, file, key)
        if ours.storage == "dcp":
            metadata = read_metadata(ours.directory, trust=trust)
            chosen = objects_of(metadata)[ours.key]
            return from_dcp(ours.directory, chosen, metadata, trust, ours.source)
    found, source = extract_state_dict(obj, file, key, trust)
    state, stripped = strip_common_prefixes(found)
    if stripped:
        source += "; stripped " + ", ".join(repr(p) for p in stripped)
    return from_memory(state, f"{source} ({file})")


def from_dcp(
    directory: Path, chosen: DcpObject, metadata: Any, trust: bool, source: str
) -> ModelSource:
    """A DCP checkpoint's object as a ``ModelSource``: each tensor gathered when asked for."""
    keys = {inner: chosen.keys[inner] for inner in chosen.tensors}
    return ModelSource(
        source=f"{source} ({directory})",
        shapes={
            k: (tuple(int(d) for d in info.size), info.properties.dtype)
            for k, info in chosen.tensors.items()
        },
        skipped=tuple(k for k in chosen.keys if k not in chosen.tensors),
        read=lambda names: stream_tensors(
            directory, {n: keys[n] for n in names}, metadata=metadata, trust=trust
        ),
    )


def from_memory(state: Mapping[str, Any], source: str) -> ModelSource:
    """A state dict already in memory as a ``ModelSource``."""
    tensors = {
        k: v.detach().cpu().contiguous() for k, v in state.items() if isinstance(v, torch.Tensor)
    }

    def read(names: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
        return ((n, tensors[n]) for n in names)

    return ModelSource(
        source=source,
        shapes={k: (tuple(v.shape), v.dtype) for k, v in tensors.items()},
        skipped=tuple(k for k in state if k not in tensors),
        read=read,
    )

"""Portable weights: load any common checkpoint into a model, on any device, saying what changed.

Accepted: multigpu checkpoints (a checkpoint directory, one ``step-*`` directory or a
``ctx.save`` directory, its ``state.pt``; sharded ones are read whole from their DCP files),
plain DCP checkpoints (a directory written by ``torch.distributed.checkpoint.save``, flat or
nested, torchtitan's step directories; or its ``.metadata``), weights in the hub format (a
``.safetensors`` file, or a directory with ``model.safetensors`` or its sharded index), plain
state dicts, state dicts nested under a usual key (``state_dict``, ``model_state_dict``,
``model``, ``module``, ``net``), saved from DataParallel / DDP (``module.`` keys), from
``torch.compile`` (``_orig_mod.``) or on CUDA (loaded on the CPU). Files are read with
``weights_only=True``; a legacy pickle needs ``trust=True`` (see ``loading``).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from multigpu.checkpoint.dcp_objects import choose_model, is_torchtitan, objects_of, read_object
from multigpu.checkpoint.hub import is_hub, open_hub, read_hub
from multigpu.checkpoint.hub_names import renamed_state
from multigpu.checkpoint.keys import match_keys, strip_common_prefixes
from multigpu.checkpoint.layout import FORMAT, read_manifest
from multigpu.checkpoint.loading import load_file, resolve
from multigpu.checkpoint.sharded import read_complete, read_whole
from multigpu.errors import CheckpointError, UsageError
from multigpu.runtime.wrappers import tied_names, unwrap_module, with_tied

log = logging.getLogger(__name__)

NESTED_KEYS = ("state_dict", "model_state_dict", "model", "module", "net")
"""Where training scripts usually put the model's state dict inside a checkpoint dict."""


@dataclass(frozen=True, kw_only=True)
class LoadReport:
    """What ``load_weights`` / ``read_weights`` found and changed; ``str()`` is one line.

    Example:
        >>> str(LoadReport(path=Path("m.pt"), source="plain state dict", tensors=4,
        ...                prefixes_stripped=("module.",), devices_mapped={"cuda:0": "cpu"}))
        "4 tensors from plain state dict (m.pt); stripped 'module.'; mapped cuda:0 -> cpu"
    """

    path: Path
    """The file read, or for a multigpu checkpoint its directory (a ``step-*`` one)."""
    source: str
    """Where the weights were found: "plain state dict", "dict key 'state_dict'", ..."""
    tensors: int
    """How many entries the state dict had."""
    prefixes_stripped: tuple[str, ...] = ()
    """Wrapper prefixes removed from the keys, outermost first."""
    devices_mapped: Mapping[str, str] = field(default_factory=dict)
    """{device recorded in the file: device loaded to}, e.g. {"cuda:0": "cpu"}."""
    missing_keys: tuple[str, ...] = ()
    """Model keys the file lacked (only with ``strict=False``)."""
    unexpected_keys: tuple[str, ...] = ()
    """File keys the model lacks (only with ``strict=False``)."""
    dtype_casts: tuple[str, ...] = ()
    """Dtype conversions the model's own dtypes forced, e.g. "float16 -> float32 (4 tensors)"."""
    trusted: bool = False
    """Whether the file was fully unpickled (``trust=True``)."""
    renamed: int = 0
    """How many of the hub-format files' names were renamed to the model's (``hub_names``)."""
    renamed_by: str = ""
    """Whose mapping renamed them: "ViTModel's conversion mapping (transformers 5.2.0)"."""

    def __str__(self) -> str:
        parts = [f"{self.tensors} tensors from {self.source} ({self.path})"]
        if self.prefixes_stripped:
            parts.append("stripped " + ", ".join(repr(p) for p in self.prefixes_stripped))
        if self.devices_mapped:
            parts.append(
                "mapped " + ", ".join(f"{a} -> {b}" for a, b in sorted(self.devices_mapped.items()))
            )
        if self.missing_keys:
            parts.append(f"missing {len(self.missing_keys)}: {_few(self.missing_keys)}")
        if self.unexpected_keys:
            parts.append(f"unexpected {len(self.unexpected_keys)}: {_few(self.unexpected_keys)}")
        if self.renamed:
            parts.append(f"renamed {self.renamed} by {self.renamed_by}")
        if self.dtype_casts:
            parts.append("cast " + ", ".join(self.dtype_casts))
        if self.trusted:
            parts.append("loaded as a trusted pickle")
        return "; ".join(parts)


def _few(names: tuple[str, ...] | list[str], n: int = 5) -> str:
    return ", ".join(names[:n]) + (", ..." if len(names) > n else "")


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


def _read(
    path: str | os.PathLike[str], key: str | None, trust: bool, map_location: str | torch.device
) -> tuple[Mapping[str, Any], LoadReport]:
    """The model state dict in ``path`` as saved, and the report of reading it (naming a
    multigpu checkpoint's directory, else the file or directory read)."""
    file = resolve(path)
    if is_hub(file):
        weights = open_hub(file)
        if key is not None:
            raise UsageError(
                f"key={key!r} names an object, but {file} holds one model's tensors "
                "(safetensors); drop key"
            )
        found: Mapping[str, Any] = read_hub(weights)
        return found, LoadReport(path=file, source=weights.kind, tensors=len(found))
    if file.is_dir():  # a plain DCP checkpoint (resolve: ours are read from their state.pt)
        metadata = read_complete(file, trust=trust)
        objects = objects_of(metadata)
        chosen = choose_model(objects, key, file)
        found = read_object(file, chosen, metadata=metadata, trust=trust)
        layout = "torchtitan step directory" if is_torchtitan(objects) else "DCP checkpoint"
        part = ", the top-level tensors" if chosen.top_level else ""
        return found, LoadReport(
            path=file,
            source=f"{layout}, object {chosen.name!r}{part}",
            tensors=len(found),
            trusted=trust,
        )
    obj, mapped = load_file(file, trust=trust, map_location=map_location)
    found, source = extract_state_dict(obj, file, key, trust)
    ours = isinstance(obj, Mapping) and obj.get("format") == FORMAT and "objects" in obj
    shown = file.parent if ours else file
    return found, LoadReport(
        path=shown, source=source, tensors=len(found), devices_mapped=mapped, trusted=trust
    )


def read_weights(
    path: str | os.PathLike[str],
    *,
    key: str | None = None,
    trust: bool = False,
    map_location: str | torch.device = "cpu",
) -> tuple[dict[str, Any], LoadReport]:
    """The model state dict in ``path`` (prefixes shared by all keys stripped) and a report.

    Without a model to match, only a prefix that EVERY key has is stripped (repeatedly).
    """
    found, report = _read(path, key, trust, map_location)
    state, stripped = strip_common_prefixes(found)  # renames keys, never drops one
    return state, replace(report, prefixes_stripped=stripped)


def _check_fit(
    state: Mapping[str, Any], current: Mapping[str, Any], strict: bool, file: Path, name: str
) -> None:
    """Refuse before anything is copied: torch's load_state_dict copies the matching tensors
    first and raises about the rest afterwards, leaving a half-loaded model."""
    shapes = [
        f"{k} {tuple(v.shape)} vs {tuple(current[k].shape)}"
        for k, v in state.items()
        if isinstance(v, torch.Tensor)
        and isinstance(current.get(k), torch.Tensor)
        and not nn.parameter.is_lazy(current[k])
        and v.shape != current[k].shape
    ]
    missing = [k for k in current if k not in state]
    unexpected = [k for k in state if k not in current]
    problems = [f"shapes differ (file vs model): {_few(shapes, 3)}"] if shapes else []
    if strict and missing:
        problems.append(f"missing {len(missing)}: {_few(missing)}")
    if strict and unexpected:
        problems.append(f"unexpected {len(unexpected)}: {_few(unexpected)}")
    if problems:
        hint = (
            "pass key=NAME for another object" if shapes else "pass strict=False to load the rest"
        )
        raise CheckpointError(
            f"the weights in {file} do not fit {name}: {'; '.join(problems)}; check that it is "
            f"the same architecture, or {hint}"
        )


def load_weights(
    model: nn.Module,
    path: str | os.PathLike[str],
    *,
    key: str | None = None,
    strict: bool = True,
    trust: bool = False,
    map_location: str | torch.device = "cpu",
) -> LoadReport:
    """Load the weights in ``path`` into ``model`` (its plain module, if wrapped).

    ``module.`` (DataParallel/DDP) and ``_orig_mod.`` (torch.compile) prefixes, nested or
    combined, are stripped only when that makes the keys match the model. On a mismatch nothing
    is copied. The report is logged at INFO.

    Args:
        path: a multigpu checkpoint directory / ``step-*`` directory / ``state.pt``, or a file
            holding a state dict, plain or nested under a usual key.
        key: which object or dict key holds the model, when several could.
        strict: every key must match (else missing/unexpected keys are reported).
        trust: allow a legacy pickle (``weights_only=False``), or a DCP index naming classes
            beyond the allow-list: only for files you trust.
        map_location: where tensors go (default CPU, so CUDA-saved files load anywhere).
    """
    target = unwrap_module(model)
    found, report = _read(path, key, trust, map_location)
    current = target.state_dict()
    if is_hub(report.path):  # the hub's own names, where transformers 5's modules differ
        found, names = renamed_state(target, found, set(current), report.path)
        report = replace(report, renamed=len(names.renamed), renamed_by=names.via)
    state, stripped = match_keys(found, set(current))  # renames keys, never drops one
    state = with_tied(state, tied_names(target))  # a tied name the file holds once (the hub)
    _check_fit(state, current, strict, report.path, type(target).__name__)
    casts = Counter(
        f"{str(v.dtype).removeprefix('torch.')} -> {str(current[k].dtype).removeprefix('torch.')}"
        for k, v in state.items()
        if isinstance(v, torch.Tensor)
        and isinstance(current.get(k), torch.Tensor)
        and v.dtype != current[k].dtype
    )
    try:
        result = target.load_state_dict(state, strict=strict)
    except RuntimeError as e:
        raise CheckpointError(
            f"the weights in {report.path} do not fit {type(target).__name__}: "
            f"{' '.join(str(e).split())}"
        ) from e
    report = replace(
        report,
        prefixes_stripped=stripped,
        missing_keys=tuple(result.missing_keys),
        unexpected_keys=tuple(result.unexpected_keys),
        dtype_casts=tuple(f"{pair} ({n} tensors)" for pair, n in sorted(casts.items())),
    )
    log.info("load_weights: %s", report)
    return report

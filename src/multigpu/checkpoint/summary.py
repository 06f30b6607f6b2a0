"""What a checkpoint holds, for ``multigpu ckpt inspect``: tensors, step, world size, health."""

from __future__ import annotations

import os
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from multigpu.checkpoint.hub import is_hub
from multigpu.checkpoint.layout import (
    FORMAT,
    MANIFEST_FILE,
    STATE_FILE,
    list_checkpoints,
    verify_checkpoint,
)
from multigpu.checkpoint.loading import is_dcp_directory, load_file, resolve
from multigpu.checkpoint.portable import extract_state_dict
from multigpu.checkpoint.sharded import METADATA_FILE, read_metadata
from multigpu.checkpoint.summary_foreign import (
    all_tensors,
    is_optimizer_state,
    row,
    shard_files,
    summarize_dcp,
    summarize_hub,
    summarize_optimizer,
)
from multigpu.errors import CheckpointError, UsageError


def _tensor_rows(state: Mapping[str, Any], prefix: str = "") -> list[dict[str, Any]]:
    return [
        row(prefix + str(name), value.shape, value.dtype)
        for name, value in state.items()
        if isinstance(value, torch.Tensor)
    ]


def _status_fields(path: Path) -> dict[str, Any]:
    status = verify_checkpoint(path)
    manifest = status.manifest or {}
    described = manifest.get("objects", {})
    return {
        "step": status.step if status.step is not None else manifest.get("step"),
        "complete": status.complete,
        "problems": list(status.problems),
        "format_version": manifest.get("version"),
        "world_size": manifest.get("world_size"),
        "epoch": manifest.get("epoch"),
        "strategy": manifest.get("strategy") or None,
        "torch_version": manifest.get("torch_version"),
        "created": manifest.get("created"),
        "objects": {n: i.get("kind") for n, i in described.items()},
        "storage": {n: i.get("storage", "state") for n, i in described.items()},
        "files": {n: int(i.get("bytes", 0)) for n, i in manifest.get("files", {}).items()},
    }


def _sharded_part(
    path: Path, storage: Mapping[str, str], *, trust: bool
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """From DCP's index alone (no tensor data is read; global shapes, whatever the shards):
    rows of the sharded models' tensors, a summary per sharded object, and per shard file what
    it holds (how the pieces are laid out over the ranks that wrote them)."""
    if "dcp" not in storage.values():
        return [], {}, {}
    metadata = read_metadata(path, trust=trust)
    paths: Mapping[str, Any] = metadata.planner_data or {}
    rows: list[dict[str, Any]] = []
    sizes: dict[str, dict[str, Any]] = {}
    for key, info in metadata.state_dict_metadata.items():
        parts = [str(p) for p in paths.get(key, (key,))]
        name, rest = parts[0], ".".join(parts[1:])
        total = sizes.setdefault(name, {"tensors": 0, "numel": 0, "bytes": 0, "values": 0})
        if not isinstance(info, TensorStorageMetadata):
            total["values"] += 1  # hyperparameters, extra state: small pickled values
            continue
        entry = row(f"{name}/{rest}", info.size, info.properties.dtype, len(info.chunks))
        total["tensors"] += 1
        total["numel"] += entry["numel"]
        total["bytes"] += entry["bytes"]
        if len(parts) > 3 and parts[1] == "state":  # an optimizer's state.<param>.<stat>
            stats = total.setdefault("stats", {})
            stats[parts[-1]] = stats.get(parts[-1], 0) + 1
        elif storage.get(name) == "dcp" and rest and parts[1] != "param_groups":
            rows.append(entry)
    return rows, sizes, shard_files(metadata, paths)


def summarize(path: str | os.PathLike[str], *, trust: bool = False) -> dict[str, Any]:
    """A JSON-ready description of ``path`` (a checkpoint root, a ``step-*`` dir, or a file).

    Keys: ``path``, ``kind``, ``complete`` (False when any checkpoint looked at is broken),
    ``tensors`` (the models' tensors: ``name``, ``shape`` — global, from DCP's index for
    sharded ones, no data read — ``dtype``, ``numel``, ``bytes``, ``pieces``: how many pieces
    it is stored in, e.g. 2 for an FSDP shard on each of 2 ranks), ``total_numel``,
    ``total_bytes``, ``devices_mapped``; for our checkpoints also ``step``, ``world_size``,
    ``epoch``, ``objects`` (name: kind), ``storage`` (name: "dcp" | "state" | "rank"),
    ``strategy`` (as saved: name, mesh, units...), ``format_version``, ``files`` (name: bytes),
    ``problems``, ``torch_version``, ``created``; for sharded (format 2) ones ``sharded`` (per
    object in the DCP files: ``tensors``, ``numel``, ``bytes``, ``values`` (non-tensor
    entries), and for an optimizer ``stats``: {"exp_avg": 4, ...}) and ``shards`` (per
    ``__<rank>_<n>.distcp`` file: ``pieces`` and ``objects``: {name: pieces}); for a root
    ``checkpoints`` (name, step, complete, problems) and ``newest_complete``.

    A plain DCP checkpoint (``dcp.save``'s directory, or its ``.metadata``) has ``objects``
    (name: ``model`` | ``optimizer`` | ``values`` | ``mixed``), ``sharded``, ``shards``,
    ``files``, ``problems`` (missing or truncated shard files), ``model`` (the object
    ``convert`` and ``load_weights`` read; None when ``--key`` must say) and ``step`` (from
    torchtitan's ``train_state`` or a ``step-N`` name). Safetensors weights (a file, or a
    directory with ``model.safetensors`` or its index) have ``files`` and ``config`` (from a
    ``config.json`` beside them). A ``torch.save``d optimizer state dict has ``optimizer``
    (``params_with_state``, ``stats``: {"exp_avg": 4, ...}, ``param_groups``: each one's
    ``params`` count and hyperparameters).
    """
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{p} does not exist; expected a checkpoint file or directory")
    if p.is_file() and p.name == METADATA_FILE:  # DCP's index stands for its directory
        p = p.parent
    if is_dcp_directory(p):
        return summarize_dcp(p, trust=trust)
    if is_hub(p):
        return summarize_hub(p)
    info: dict[str, Any] = {"path": str(p)}
    if p.is_dir() and not (p / MANIFEST_FILE).exists() and not (p / STATE_FILE).exists():
        statuses = list_checkpoints(p)
        if not statuses:
            raise UsageError(f"{p} is a directory without checkpoints; expected step-* inside")
        info["kind"] = "multigpu checkpoint directory"
        info["checkpoints"] = [
            {
                "name": s.path.name,
                "step": s.step,
                "complete": s.complete,
                "problems": list(s.problems),
            }
            for s in statuses
        ]
        complete = [s for s in statuses if s.complete]
        info["complete"] = len(complete) == len(statuses)
        if not complete:
            info.update(tensors=[], total_numel=0, total_bytes=0, devices_mapped={})
            return info
        p = complete[-1].path
        info["newest_complete"] = p.name
    sharded_rows: list[dict[str, Any]] = []
    if p.is_dir():
        fields = _status_fields(p)
        info.update(
            fields,
            kind="multigpu checkpoint",
            complete=info.get("complete", True) and fields["complete"],
        )
        try:
            sharded_rows, info["sharded"], info["shards"] = _sharded_part(
                p, fields["storage"], trust=trust
            )
        except CheckpointError as e:  # a broken index: described, exit 1
            refused = isinstance(e.__cause__, pickle.UnpicklingError) and not trust
            hint = "; only if you trust its source, pass --trust" if refused else ""
            info.setdefault("problems", []).append(f"{e}{hint}")
            info["complete"] = False
        file = p / STATE_FILE
        if not file.is_file():
            info.update(tensors=[], total_numel=0, total_bytes=0, devices_mapped={})
            return info
    else:
        file = resolve(p)  # refuses one file of a DCP checkpoint, naming its directory
    try:
        obj, mapped = load_file(file, trust=trust)
    except CheckpointError as e:
        if not p.is_dir():
            raise
        # A broken checkpoint is still described (exit 1), not refused as bad input.
        info.setdefault("problems", []).append(str(e))
        info.update(complete=False, tensors=[], total_numel=0, total_bytes=0, devices_mapped={})
        return info
    rows: list[dict[str, Any]] = list(sharded_rows)
    if isinstance(obj, Mapping) and obj.get("format") == FORMAT:
        info.setdefault("kind", "multigpu checkpoint")
        info.setdefault("complete", True)
        info.setdefault("step", obj.get("step"))
        info.setdefault("world_size", obj.get("world_size"))
        for name, state in obj.get("objects", {}).items():
            if (
                isinstance(state, Mapping)
                and state
                and all(isinstance(v, torch.Tensor) for v in state.values())
            ):
                rows += _tensor_rows(state, f"{name}/")
    elif is_optimizer_state(obj):
        described = summarize_optimizer(obj)
        rows = described.pop("tensors")
        info.update(described, complete=True)
    else:
        try:
            state, source = extract_state_dict(obj, file, None)
            rows = _tensor_rows(state)
            info["kind"] = source
        except UsageError:  # every tensor it has, by its path: never "0 tensors" when it has some
            info["kind"] = f"{type(obj).__name__} (no single state dict)"
            rows = all_tensors(obj)
        info["complete"] = True
    info["tensors"] = rows
    info["total_numel"] = sum(r["numel"] for r in rows)
    info["total_bytes"] = sum(r["bytes"] for r in rows)
    info["devices_mapped"] = mapped
    return info

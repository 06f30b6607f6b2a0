"""``ckpt inspect``'s descriptions: plain DCP checkpoints, hub-format weights, what a ``torch.save``
file holds (a state dict, an optimizer's state dict, a multigpu ``state.pt``), and the rows and
shard tables every format's description shares (keys: ``dispatch.summarize``)."""

from __future__ import annotations

import json
import math
import pickle
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from multigpu.checkpoint.formats.dcp_objects import (
    DcpObject,
    choose_model,
    is_torchtitan,
    objects_of,
)
from multigpu.checkpoint.formats.hub import CONFIG_FILE, SUFFIX, open_hub
from multigpu.checkpoint.formats.model_state import extract_state_dict
from multigpu.checkpoint.native.layout import FORMAT
from multigpu.checkpoint.native.sharded import file_problems, read_metadata, read_whole
from multigpu.errors import CheckpointError, UsageError

_STEP = re.compile(r"step-(\d+)$")


def row(name: str, shape: Any, dtype: torch.dtype, pieces: int = 1) -> dict[str, Any]:
    """One tensor of ``summarize``'s ``tensors``."""
    numel = math.prod(shape)
    return {
        "name": name,
        "shape": list(shape),
        "dtype": str(dtype).removeprefix("torch."),
        "numel": numel,
        "bytes": numel * dtype.itemsize,
        "pieces": pieces,
    }


def _totals(info: dict[str, Any]) -> dict[str, Any]:
    info["total_numel"] = sum(r["numel"] for r in info["tensors"])
    info["total_bytes"] = sum(r["bytes"] for r in info["tensors"])
    info.setdefault("devices_mapped", {})
    return info


def _object_summary(obj: DcpObject) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "tensors": len(obj.tensors),
        "numel": obj.numel,
        "bytes": obj.bytes,
        "values": obj.values,
    }
    if obj.kind == "optimizer":  # state.<param>.<stat>: how many of each statistic
        stats: dict[str, int] = {}
        for inner in obj.tensors:
            stat = inner.rsplit(".", 1)[-1]
            stats[stat] = stats.get(stat, 0) + 1
        summary["stats"] = stats
    return summary


def shard_files(
    metadata: Any, paths: Mapping[str, Any], owners: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """{file: {"pieces": n, "objects": {object: pieces}}} from the index's storage records;
    ``owners``: {key in the index: its object} where the key's path does not say it (the
    top-level tensors).

    A record's ``relative_path`` is the field of DCP's ``FileSystemWriter`` (``_StorageInfo``);
    another writer's records are skipped rather than guessed at.
    """
    files: dict[str, Any] = {}
    for index, where in (metadata.storage_data or {}).items():
        file = getattr(where, "relative_path", None)
        if not isinstance(file, str):
            continue
        fqn = getattr(index, "fqn", "")
        name = (owners or {}).get(fqn) or str(paths.get(fqn, (fqn.split(".", 1)[0],))[0])
        entry = files.setdefault(file, {"pieces": 0, "objects": {}})
        entry["pieces"] += 1
        entry["objects"][name] = entry["objects"].get(name, 0) + 1
    for entry in files.values():
        entry["objects"] = dict(sorted(entry["objects"].items()))
    return dict(sorted(files.items()))


def summarize_dcp(directory: Path, *, trust: bool) -> dict[str, Any]:
    """``summarize`` of a plain DCP checkpoint directory, from its index (and the files' sizes);
    the only data read is torchtitan's ``train_state`` (its step)."""
    try:
        metadata = read_metadata(directory, trust=trust)
    except CheckpointError as e:  # a broken index: described, exit 1 (as for our checkpoints)
        refused = isinstance(e.__cause__, pickle.UnpicklingError) and not trust
        hint = "; only if you trust its source, pass --trust" if refused else ""
        return _totals(
            {
                "path": str(directory),
                "kind": "DCP checkpoint",
                "complete": False,
                "problems": [f"{e}{hint}"],
                "tensors": [],
            }
        )
    objects = objects_of(metadata)
    titan = is_torchtitan(objects)
    files, problems = file_problems(directory, metadata)
    info: dict[str, Any] = {
        "path": str(directory),
        "kind": "torchtitan step directory (DCP)" if titan else "DCP checkpoint",
        "complete": not problems,
        "problems": problems,
        "objects": {n: o.kind for n, o in objects.items()},
        "storage": {n: "dcp" for n in objects},
        "sharded": {n: _object_summary(o) for n, o in objects.items()},
        "shards": shard_files(
            metadata,
            metadata.planner_data or {},
            {fqn: o.name for o in objects.values() if o.top_level for fqn in o.keys.values()},
        ),
        "files": files,
        "tensors": [
            row(k if o.top_level else f"{n}/{k}", t.size, t.properties.dtype, len(t.chunks))
            for n, o in objects.items()
            if o.kind == "model"
            for k, t in o.tensors.items()
        ],
    }
    try:
        info["model"] = choose_model(objects, None, directory).name
    except UsageError:
        info["model"] = None  # several, or none: convert and load_weights need --key
    step = _STEP.search(directory.name)
    if step:
        info["step"] = int(step.group(1))
    state = objects.get("train_state")
    if state is not None and "step" in state.keys and not problems:
        try:
            saved = read_whole(directory, {"train_state"}, trust=trust)["train_state"]
            info["step"] = int(saved["step"])
        except (CheckpointError, KeyError, TypeError, ValueError) as e:
            info["problems"].append(f"train_state unreadable ({e})")
            info["complete"] = False
    return _totals(info)


def summarize_hub(path: Path) -> dict[str, Any]:
    """``summarize`` of a ``.safetensors`` file or a hub-format directory, from the headers."""
    weights = open_hub(path)
    files = sorted(set(weights.files.values()))
    info: dict[str, Any] = {
        "path": str(path),
        "kind": f"safetensors weights ({len(files)} file{'s' if len(files) > 1 else ''})",
        "complete": True,
        "files": {f.name: f.stat().st_size for f in files},
        "tensors": [row(n, s, weights.dtypes[n]) for n, s in weights.shapes.items()],
    }
    config = (path if path.is_dir() else path.parent) / CONFIG_FILE
    if config.is_file() and (path.is_dir() or path.name.endswith(SUFFIX)):
        try:
            settings = json.loads(config.read_text())
            info["config"] = {
                k: settings.get(k) for k in ("model_type", "architectures", "torch_dtype")
            }
        except (OSError, ValueError):
            info["config"] = None
    return _totals(info)


def is_optimizer_state(obj: Any) -> bool:
    """Whether ``obj`` is a ``torch.optim.Optimizer.state_dict()``."""
    return (
        isinstance(obj, Mapping)
        and isinstance(obj.get("state"), Mapping)
        and isinstance(obj.get("param_groups"), list)
    )


def summarize_optimizer(obj: Mapping[str, Any]) -> dict[str, Any]:
    """``summarize``'s ``tensors`` and ``optimizer`` for an optimizer's state dict: its tensors
    (``state/<param>/<stat>``), how many parameters have state, each statistic's count, and
    each param group's size and hyperparameters."""
    rows: list[dict[str, Any]] = []
    stats: dict[str, int] = {}
    for param, entries in obj["state"].items():
        for stat, value in (entries or {}).items():
            stats[str(stat)] = stats.get(str(stat), 0) + 1
            if isinstance(value, torch.Tensor):
                rows.append(row(f"state/{param}/{stat}", value.shape, value.dtype))
    groups = []
    for group in obj["param_groups"]:
        hyper = {
            k: v
            for k, v in group.items()
            if k != "params" and isinstance(v, (int, float, str, bool, type(None)))
        }
        groups.append({"params": len(group.get("params", [])), **hyper})
    return {
        "kind": "optimizer state dict",
        "tensors": rows,
        "optimizer": {
            "params_with_state": len(obj["state"]),
            "stats": stats,
            "param_groups": groups,
        },
    }


def all_tensors(obj: Any, prefix: str = "") -> list[dict[str, Any]]:
    """Every tensor inside nested dicts / lists / tuples, named by its path (``a/b/0``)."""
    if isinstance(obj, torch.Tensor):
        return [row(prefix or "tensor", obj.shape, obj.dtype)]
    if isinstance(obj, Mapping):
        items: Any = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        return []
    return [r for k, v in items for r in all_tensors(v, f"{prefix}/{k}" if prefix else str(k))]


def tensor_rows(state: Mapping[str, Any], prefix: str = "") -> list[dict[str, Any]]:
    """A row per tensor of a state dict."""
    return [
        row(prefix + str(name), value.shape, value.dtype)
        for name, value in state.items()
        if isinstance(value, torch.Tensor)
    ]


def describe_loaded(
    obj: Any,
    file: Path,
    info: dict[str, Any],
    mapped: Mapping[str, str],
    rows: list[dict[str, Any]],
) -> dict[str, Any]:
    """``info`` completed with what a loaded ``torch.save`` file holds; ``rows``: the tensors
    already described (a multigpu checkpoint's sharded part)."""
    rows = list(rows)
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
                rows += tensor_rows(state, f"{name}/")
    elif is_optimizer_state(obj):
        described = summarize_optimizer(obj)
        rows = described.pop("tensors")
        info.update(described, complete=True)
    else:
        try:
            state, source = extract_state_dict(obj, file, None)
            rows = tensor_rows(state)
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

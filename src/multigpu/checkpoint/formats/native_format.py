"""Our own format (``native/``) behind the format protocol: a ``ctx.save`` or ``step-*``
directory, or a ``Checkpointer``'s directory of them.

``dispatch.format_of`` hands ``load``, ``read_model`` and ``open_model`` the complete checkpoint
to read (a directory's newest), and ``summarize`` the path as given: a ``Checkpointer``'s
directory is described with every checkpoint in it, complete or not.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from multigpu.checkpoint.formats.base import ModelRead, ModelSource
from multigpu.checkpoint.formats.inspection import describe_loaded, row, shard_files
from multigpu.checkpoint.formats.torch_file import load_file
from multigpu.checkpoint.formats.torch_format import TorchFileFormat
from multigpu.checkpoint.native.layout import (
    MANIFEST_FILE,
    STATE_FILE,
    list_checkpoints,
    read_manifest,
    verify_checkpoint,
)
from multigpu.checkpoint.native.objects import kind_of
from multigpu.checkpoint.native.restore import load_part, restore_objects, saved_names
from multigpu.checkpoint.native.sharded import read_metadata
from multigpu.checkpoint.native.snapshot import StateAdapter
from multigpu.errors import CheckpointError, CheckpointMismatchError

log = logging.getLogger(__name__)


def is_root(path: Path) -> bool:
    """Whether ``path`` is a directory of checkpoints rather than one checkpoint."""
    return not (path / MANIFEST_FILE).exists() and not (path / STATE_FILE).exists()


class NativeFormat:
    """A multigpu checkpoint: manifest, ``COMMITTED``, ``state.pt``, rank files, DCP shards."""

    name = "multigpu"

    def summarize(self, path: Path, *, trust: bool) -> dict[str, Any]:
        info: dict[str, Any] = {"path": str(path)}
        p = path
        if p.is_dir() and is_root(p):
            statuses = list_checkpoints(p)
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
        fields = _status_fields(p)
        info.update(
            fields,
            kind="multigpu checkpoint",
            complete=info.get("complete", True) and fields["complete"],
        )
        sharded_rows: list[dict[str, Any]] = []
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
        try:
            obj, mapped = load_file(file, trust=trust)
        except CheckpointError as e:
            # A broken checkpoint is still described (exit 1), not refused as bad input.
            info.setdefault("problems", []).append(str(e))
            info.update(complete=False, tensors=[], total_numel=0, total_bytes=0, devices_mapped={})
            return info
        return describe_loaded(obj, file, info, mapped, sharded_rows)

    # The model of one of our checkpoints is the one in its state.pt, read as any torch file.
    def open_model(self, path: Path, *, key: str | None, trust: bool) -> ModelSource:
        return TorchFileFormat().open_model(path / STATE_FILE, key=key, trust=trust)

    def read_model(
        self, path: Path, *, key: str | None, trust: bool, map_location: str | torch.device
    ) -> ModelRead:
        return TorchFileFormat().read_model(
            path / STATE_FILE, key=key, trust=trust, map_location=map_location
        )

    def load(
        self, path: Path, state: MutableMapping[str, Any], adapter: StateAdapter, *, rank: int
    ) -> dict[str, Any]:
        manifest = read_manifest(path)
        small_saved = load_part(path / STATE_FILE).get("objects", {})
        available = saved_names(manifest, small_saved)
        missing = sorted(k for k in state if k not in available)
        if missing:
            raise CheckpointMismatchError(
                f"checkpoint {path} has no entry {missing} (it holds {sorted(available)}); ask "
                "for the names it was saved with"
            )
        stored_elsewhere = sorted(
            k for k, v in state.items() if kind_of(v) == "value" and k not in small_saved
        )
        if stored_elsewhere:
            raise CheckpointMismatchError(
                f"checkpoint {path} holds {stored_elsewhere} as models or optimizers, but state "
                "gives plain values for them; pass the objects to load them into"
            )
        stateful = {k: v for k, v in state.items() if kind_of(v) != "value"}
        restore_objects(path, stateful, manifest, small_saved, adapter)
        for name, value in state.items():
            if kind_of(value) == "value":
                state[name] = small_saved[name]
        if rank == 0:
            log.info("loaded %s from %s", ", ".join(state), path)
        return {k: v for k, v in small_saved.items() if k not in state}


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

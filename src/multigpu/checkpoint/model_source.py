"""A checkpoint's model as a source of tensors, read one at a time where the format allows it.

Sharded checkpoints (ours and plain DCP ones) and hub-format weights are streamed: each tensor is
read when asked for (a DCP tensor's pieces gathered from every shard file), so an export holds
one tensor, not the model. Other files (``torch.save`` state dicts, format-1 checkpoints) can
only be read whole; they are, once, and then handed out from memory.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from multigpu.checkpoint.dcp_objects import (
    DcpObject,
    choose_model,
    is_torchtitan,
    objects_of,
    stream_tensors,
)
from multigpu.checkpoint.hub import is_hub, open_hub, stream_hub
from multigpu.checkpoint.keys import strip_common_prefixes
from multigpu.checkpoint.layout import FORMAT
from multigpu.checkpoint.loading import load_file, resolve
from multigpu.checkpoint.portable import choose_ours, extract_state_dict
from multigpu.checkpoint.sharded import read_complete, read_metadata

Reader = Callable[[list[str]], Iterator[tuple[str, torch.Tensor]]]


@dataclass(frozen=True, kw_only=True)
class ModelSource:
    """The tensors of one model in a checkpoint: their shapes first, their data on demand."""

    source: str
    """Where they are, for a report line: ``multigpu checkpoint step 2, object 'model' (...)``."""
    shapes: dict[str, tuple[tuple[int, ...], torch.dtype]]
    """{name: (shape, dtype)} of every tensor, in the checkpoint's order."""
    skipped: tuple[str, ...]
    """Entries that are not tensors (a module's extra state): nothing to export."""
    read: Reader
    """``read(names)``: ``(name, tensor)`` for each name, in that order, on the CPU."""

    def nbytes(self, name: str) -> int:
        """Bytes of tensor ``name``."""
        shape, dtype = self.shapes[name]
        n = 1
        for d in shape:
            n *= d
        return n * dtype.itemsize


def open_model(path: str | os.PathLike[str], *, key: str | None, trust: bool) -> ModelSource:
    """The model in ``path`` (anything ``load_weights`` reads) as a ``ModelSource``."""
    file = resolve(path)
    if is_hub(file):
        weights = open_hub(file)
        return ModelSource(
            source=weights.describe(),
            shapes={k: (s, weights.dtypes[k]) for k, s in weights.shapes.items()},
            skipped=(),
            read=lambda names: stream_hub(weights, names),
        )
    if file.is_dir():  # a plain DCP checkpoint
        metadata = read_complete(file, trust=trust)
        objects = objects_of(metadata)
        chosen = choose_model(objects, key, file)
        layout = "torchtitan step directory" if is_torchtitan(objects) else "DCP checkpoint"
        part = ", the top-level tensors" if chosen.top_level else ""
        return _from_dcp(file, chosen, metadata, trust, f"{layout}, object {chosen.name!r}{part}")
    obj, _ = load_file(file, trust=trust)
    if isinstance(obj, Mapping) and obj.get("format") == FORMAT and "objects" in obj:
        ours = choose_ours(obj, file, key)
        if ours.storage == "dcp":
            metadata = read_metadata(ours.directory, trust=trust)
            chosen = objects_of(metadata)[ours.key]
            return _from_dcp(ours.directory, chosen, metadata, trust, ours.source)
    found, source = extract_state_dict(obj, file, key, trust)
    state, stripped = strip_common_prefixes(found)
    if stripped:
        source += "; stripped " + ", ".join(repr(p) for p in stripped)
    return _from_memory(state, f"{source} ({file})")


def _from_dcp(
    directory: Path, chosen: DcpObject, metadata: Any, trust: bool, source: str
) -> ModelSource:
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


def _from_memory(state: Mapping[str, Any], source: str) -> ModelSource:
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

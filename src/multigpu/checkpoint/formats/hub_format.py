"""Weights in the Hugging Face hub format behind the format protocol: a ``.safetensors`` file,
or a directory with ``model.safetensors`` or its sharded index."""

from __future__ import annotations

from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import torch

from multigpu.checkpoint.formats.base import ModelRead, ModelSource
from multigpu.checkpoint.formats.hub import open_hub, read_hub, stream_hub
from multigpu.checkpoint.formats.hub_load import load_hub
from multigpu.checkpoint.formats.inspection import summarize_hub
from multigpu.checkpoint.native.snapshot import StateAdapter
from multigpu.errors import UsageError


class HubFormat:
    """safetensors files: one model's tensors, read from the files' headers and slices."""

    name = "hub"

    def summarize(self, path: Path, *, trust: bool) -> dict[str, Any]:
        return summarize_hub(path)

    def open_model(self, path: Path, *, key: str | None, trust: bool) -> ModelSource:
        weights = open_hub(path)
        return ModelSource(
            source=weights.describe(),
            shapes={k: (s, weights.dtypes[k]) for k, s in weights.shapes.items()},
            skipped=(),
            read=lambda names: stream_hub(weights, names),
        )

    def read_model(
        self, path: Path, *, key: str | None, trust: bool, map_location: str | torch.device
    ) -> ModelRead:
        weights = open_hub(path)
        if key is not None:
            raise UsageError(
                f"key={key!r} names an object, but {path} holds one model's tensors "
                "(safetensors); drop key"
            )
        return ModelRead(state=read_hub(weights), path=path, source=weights.kind)

    def load(
        self, path: Path, state: MutableMapping[str, Any], adapter: StateAdapter, *, rank: int
    ) -> dict[str, Any]:
        return load_hub(path, state, adapter, rank=rank)

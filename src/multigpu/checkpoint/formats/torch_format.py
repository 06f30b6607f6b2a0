"""A ``torch.save`` file behind the format protocol: a state dict (plain, nested under a usual
key, from DDP or ``torch.compile``), an optimizer's state dict, a pickled module (only with
``trust``), or a multigpu checkpoint's ``state.pt`` given on its own."""

from __future__ import annotations

from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import torch

from multigpu.checkpoint.formats.base import ModelRead, ModelSource, not_a_directory
from multigpu.checkpoint.formats.inspection import describe_loaded
from multigpu.checkpoint.formats.model_state import read_loaded, source_of_loaded
from multigpu.checkpoint.formats.torch_file import load_file
from multigpu.checkpoint.native.snapshot import StateAdapter


class TorchFileFormat:
    """One file written by ``torch.save``, read with ``weights_only`` unless trusted."""

    name = "torch"

    def summarize(self, path: Path, *, trust: bool) -> dict[str, Any]:
        obj, mapped = load_file(path, trust=trust)
        return describe_loaded(obj, path, {"path": str(path)}, mapped, [])

    def open_model(self, path: Path, *, key: str | None, trust: bool) -> ModelSource:
        obj, _ = load_file(path, trust=trust)
        return source_of_loaded(obj, path, key, trust)

    def read_model(
        self, path: Path, *, key: str | None, trust: bool, map_location: str | torch.device
    ) -> ModelRead:
        obj, mapped = load_file(path, trust=trust, map_location=map_location)
        return read_loaded(obj, path, key, trust, mapped)

    def load(
        self, path: Path, state: MutableMapping[str, Any], adapter: StateAdapter, *, rank: int
    ) -> dict[str, Any]:
        raise not_a_directory(path)  # dispatch.format_of refuses a file for ctx.load first

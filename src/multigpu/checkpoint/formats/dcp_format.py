"""A plain DCP checkpoint behind the format protocol: a directory written by
``torch.distributed.checkpoint.save`` itself (flat or nested; torchtitan's step directories)."""

from __future__ import annotations

from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import torch

from multigpu.checkpoint.formats.base import ModelRead, ModelSource
from multigpu.checkpoint.formats.dcp_load import load_dcp
from multigpu.checkpoint.formats.dcp_objects import (
    DcpObject,
    choose_model,
    is_torchtitan,
    objects_of,
    read_object,
)
from multigpu.checkpoint.formats.inspection import summarize_dcp
from multigpu.checkpoint.formats.model_state import from_dcp
from multigpu.checkpoint.native.sharded import read_complete
from multigpu.checkpoint.native.snapshot import StateAdapter


def _source(objects: dict[str, DcpObject], chosen: DcpObject) -> str:
    layout = "torchtitan step directory" if is_torchtitan(objects) else "DCP checkpoint"
    part = ", the top-level tensors" if chosen.top_level else ""
    return f"{layout}, object {chosen.name!r}{part}"


class DcpFormat:
    """A DCP checkpoint directory: ``.metadata`` (its index) and ``*.distcp`` shard files."""

    name = "dcp"

    def summarize(self, path: Path, *, trust: bool) -> dict[str, Any]:
        return summarize_dcp(path, trust=trust)

    def open_model(self, path: Path, *, key: str | None, trust: bool) -> ModelSource:
        metadata = read_complete(path, trust=trust)
        objects = objects_of(metadata)
        chosen = choose_model(objects, key, path)
        return from_dcp(path, chosen, metadata, trust, _source(objects, chosen))

    def read_model(
        self, path: Path, *, key: str | None, trust: bool, map_location: str | torch.device
    ) -> ModelRead:
        metadata = read_complete(path, trust=trust)
        objects = objects_of(metadata)
        chosen = choose_model(objects, key, path)
        found = read_object(path, chosen, metadata=metadata, trust=trust)
        return ModelRead(state=found, path=path, source=_source(objects, chosen), trusted=trust)

    def load(
        self, path: Path, state: MutableMapping[str, Any], adapter: StateAdapter, *, rank: int
    ) -> dict[str, Any]:
        return load_dcp(path, state, adapter)

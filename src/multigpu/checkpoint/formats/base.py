"""What every checkpoint format does: the one protocol ``checkpoint.dispatch`` calls.

A format is told a path that ``dispatch.format_of`` already recognised as its own (the newest
complete checkpoint of a ``Checkpointer``'s directory already chosen, a DCP ``.metadata`` already
replaced by its directory), and does the four things a caller asks of a checkpoint: describe it
(``multigpu ckpt inspect``), hand out its model's tensors one at a time (``ckpt convert``), read
its model's state dict whole (``load_weights``), and fill a run's objects from it (``ctx.load``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from multigpu.errors import CheckpointUnreadableError

if TYPE_CHECKING:
    from multigpu.checkpoint.native.snapshot import StateAdapter


def not_a_directory(path: Path) -> CheckpointUnreadableError:
    """What ``ctx.load`` says of a path that is not a checkpoint it reads (a file, nothing)."""
    return CheckpointUnreadableError(
        f"{path} is not a checkpoint directory; expected a path given to ctx.save, a "
        "Checkpointer's directory, a DCP checkpoint directory or safetensors weights"
    )


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


@dataclass(frozen=True, kw_only=True)
class ModelRead:
    """A model's state dict read whole, as saved (no prefix stripped), and where it came from."""

    state: Mapping[str, Any]
    """The state dict: names -> tensors (and a module's extra state)."""
    path: Path
    """What to name in a report: the file read, or the checkpoint directory."""
    source: str
    """Where in it the weights were: "plain state dict", "DCP checkpoint, object 'model'", ..."""
    devices_mapped: Mapping[str, str] = field(default_factory=dict)
    """{device recorded in the file: device loaded to}, e.g. {"cuda:0": "cpu"}."""
    trusted: bool = False
    """Whether anything was unpickled beyond ``weights_only`` (``trust=True``)."""


class CheckpointFormat(Protocol):
    """One checkpoint format: ours, a plain DCP directory, hub-format weights, a torch file."""

    name: str
    """``multigpu``, ``dcp``, ``hub`` or ``torch``."""

    def summarize(self, path: Path, *, trust: bool) -> dict[str, Any]:
        """``multigpu ckpt inspect``'s description (see ``dispatch.summarize`` for its keys)."""
        ...

    def open_model(self, path: Path, *, key: str | None, trust: bool) -> ModelSource:
        """The model's tensors, streamed where the format allows it (``ckpt convert``)."""
        ...

    def read_model(
        self, path: Path, *, key: str | None, trust: bool, map_location: str | torch.device
    ) -> ModelRead:
        """The model's state dict, whole (``load_weights``, ``ckpt convert`` to a file)."""
        ...

    def load(
        self, path: Path, state: MutableMapping[str, Any], adapter: StateAdapter, *, rank: int
    ) -> dict[str, Any]:
        """Fill ``state`` in place, resharded to the strategy ``adapter`` (``ctx.load``;
        collective); return the saved entries ``state`` did not ask for."""
        ...

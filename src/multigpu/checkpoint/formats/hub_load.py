"""``ctx.load`` of hub-format weights: each rank reads, from the safetensors files, what it holds.

The files are put behind DCP's own loading (``torch.distributed.checkpoint.load`` with a
``StorageReader`` of ours): DCP's planner works out which part of each tensor every rank's state
holds — a whole tensor under single or DDP, its rows under FSDP, its stage's tensors under a
pipeline — and the reader cuts exactly that out with ``safe_open(...).get_slice``, so no rank
reads (or holds) the whole model. The strategy's state is then loaded as for a checkpoint of
our own, which works for a model made on the meta device in ``ctx.init_module()`` too.

A name the model ties to another (GPT-2's ``lm_head.weight`` is ``transformer.wte.weight``)
is read from the other when the files leave it out, as ``transformers`` saves them. Files in the
hub's own names (``save_pretrained``'s: ViT's ``vit.encoder.layer.0.attention.attention.key``
for the module ``vit.layers.0.attention.k_proj``) are read under the model's names, by the
conversion mapping of the Hugging Face model(s) in it (``hub_names``). Names the model has and
the files lack, names the files have and no rank's model has, shapes that differ, and names only
a conversion (not a rename) makes are refused, in one line, before any tensor is read.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from multigpu.checkpoint.formats.hub import HubWeights, open_file, open_hub, read_slice
from multigpu.checkpoint.formats.hub_names import FileNames, model_names
from multigpu.checkpoint.native.sharded import load_with_reader
from multigpu.checkpoint.native.snapshot import StateAdapter
from multigpu.errors import CheckpointMismatchError, UsageError
from multigpu.runtime.wrappers import tied_names

log = logging.getLogger(__name__)


def _few(names: list[str], n: int = 5) -> str:
    return ", ".join(names[:n]) + (f" (and {len(names) - n} more)" if len(names) > n else "")


@dataclass(frozen=True)
class _Stored:
    """Where one name's data is: its file and its name in that file."""

    file: Path
    name: str


class HubReader(StorageReader):
    """DCP's view of safetensors files: one chunk per tensor at offset 0, read by slices.

    ``aliases``: {name the model has: another name of the same parameter}; a name the files
    lack is read from its alias (tied weights). ``renamed``: {name in the files: the model's
    name for it}. ``bytes_read``: the tensor bytes this reader has read so far (this rank's
    share).
    """

    def __init__(
        self,
        weights: HubWeights,
        aliases: Mapping[str, str],
        renamed: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.weights = weights
        self.bytes_read = 0
        renamed = renamed or {}
        self.stored = {renamed.get(n, n): _Stored(f, n) for n, f in weights.files.items()}
        for name, source in aliases.items():
            if name not in self.stored and source in self.stored:
                self.stored[name] = self.stored[source]

    def reset(self, checkpoint_id: Any = None) -> None:
        """Nothing to reset: the reader is made for one load."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """Every name's global shape and dtype, from the files' headers."""
        tensors: dict[str, Any] = {}
        for name, where in self.stored.items():
            shape = self.weights.shapes[where.name]
            size = torch.Size(shape)
            tensors[name] = TensorStorageMetadata(
                properties=TensorProperties(dtype=self.weights.dtypes[where.name]),
                size=size,
                chunks=[ChunkStorageMetadata(offsets=torch.Size([0] * len(shape)), sizes=size)],
            )
        return Metadata(state_dict_metadata=tensors)

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *a: Any) -> None:
        """Nothing to set up: where each name is stored is known already."""

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """The plan as the planner made it."""
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """The plans as the planner made them."""
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Cut each planned piece out of its file and copy it into this rank's tensor."""
        by_file: dict[Path, list[Any]] = {}
        for item in plan.items:
            by_file.setdefault(self.stored[item.storage_index.fqn].file, []).append(item)
        for file, items in by_file.items():
            with open_file(file) as handle:
                for item in items:
                    name = self.stored[item.storage_index.fqn].name
                    index = tuple(
                        slice(int(o), int(o) + int(n))
                        for o, n in zip(item.storage_offsets, item.lengths, strict=True)
                    )
                    piece = read_slice(handle, name, index) if index else handle.get_tensor(name)
                    self.bytes_read += piece.numel() * piece.element_size()
                    target = planner.resolve_tensor(item).detach()
                    target.copy_(piece)  # casts to the model's dtype
                    planner.commit_tensor(item, target)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        """Never picked by DCP on its own: given explicitly."""
        return False


class HubPlanner(DefaultLoadPlanner):
    """DCP's planner, refusing names and shapes that do not fit in one line, on every rank."""

    def __init__(
        self, where: Path, aliases: Mapping[str, str], names: FileNames | None = None
    ) -> None:
        super().__init__()
        self.where = where
        self.aliases = aliases
        self.names = names or FileNames()

    def create_local_plan(self) -> LoadPlan:
        """This rank's plan; a name of its model missing from the files, a shape differing, or
        a name only a conversion makes, is an error (raised inside DCP's planning, so every rank
        gets it, none waits)."""
        assert self.metadata is not None
        if self.names.refused:
            raise CheckpointMismatchError(
                f"the weights in {self.where} do not load into this model as stored: "
                f"{self.names.refused}"
            )
        saved = self.metadata.state_dict_metadata
        missing = sorted(k for k in self.state_dict if k not in saved)
        shapes = []
        for name, value in self.state_dict.items():
            info = saved.get(name)
            if (
                isinstance(info, TensorStorageMetadata)
                and isinstance(value, torch.Tensor)
                and tuple(info.size) != tuple(value.shape)
            ):
                shapes.append(f"{name} {tuple(info.size)} in the files vs {tuple(value.shape)}")
        problems = [f"shapes differ: {_few(shapes, 3)}"] if shapes else []
        if missing:  # with what the files have instead: a renamed prefix shows at once
            # Not the model's tied names: the reader lists them as stored (read from their twin).
            unmatched = sorted(
                k for k in saved if k not in self.state_dict and k not in self.aliases
            )
            instead = f" (they have, unmatched here: {_few(unmatched)})" if unmatched else ""
            problems.append(f"the files lack {len(missing)}: {_few(missing)}{instead}")
        if problems:
            raise CheckpointMismatchError(
                f"the weights in {self.where} do not fit this model{self._renamed()}: "
                f"{'; '.join(problems)}; build the model from the config these weights were "
                "saved with"
            )
        return super().create_local_plan()

    def create_global_plan(self, global_plan: list[LoadPlan]) -> list[LoadPlan]:
        """The plans of every rank; a tensor of the files that no rank asks for is an error."""
        assert self.metadata is not None
        asked = {item.dest_index.fqn for plan in global_plan for item in plan.items}
        asked |= {self.aliases[n] for n in asked if n in self.aliases}
        unexpected = [n for n in self.metadata.state_dict_metadata if n not in asked]
        unexpected = [n for n in unexpected if n not in self.aliases]  # a tie's second name
        if unexpected:
            raise CheckpointMismatchError(
                f"the weights in {self.where} do not fit this model{self._renamed()}: it has no "
                f"{len(unexpected)} of the files' tensors: {_few(sorted(unexpected))}; build the "
                "model from the config these weights were saved with"
            )
        return super().create_global_plan(global_plan)

    def _renamed(self) -> str:
        """Which names were renamed before they were compared, for a refusal."""
        if not self.names.renamed:
            return ""
        renamed = len(self.names.renamed)
        return f" (after renaming {renamed} of the files' names by {self.names.via})"


def tied_aliases(model: nn.Module) -> dict[str, str]:
    """{name: another name of the same parameter} for tensors known by several names, both ways
    (a file may hold either)."""
    aliases = tied_names(model)
    for alias, first in list(aliases.items()):
        aliases.setdefault(first, alias)
    return aliases


def load_hub(
    path: Path, state: Mapping[str, Any], adapter: StateAdapter, *, rank: int
) -> dict[str, Any]:
    """Load the hub-format weights at ``path`` into the one module of ``state`` (collective)."""
    modules = [(n, o) for n, o in state.items() if isinstance(o, nn.Module)]
    if len(modules) != 1 or len(state) != 1:
        given = ", ".join(f"{n}={type(o).__name__}" for n, o in state.items())
        raise UsageError(
            f"ctx.load({path}) got {given}; safetensors weights hold one model's tensors: pass "
            '{"model": model} (load its optimizer and the rest from a checkpoint)'
        )
    name, model = modules[0]
    weights = open_hub(path)
    aliases = tied_aliases(model)
    target = adapter.model_state(model)
    names = model_names(model, weights.files, set(target) | set(aliases))
    reader = HubReader(weights, aliases, names.renamed)
    load_with_reader(target, reader, HubPlanner(path, aliases, names), where=path)
    adapter.load_model_state(model, target)
    log.info(
        "rank %d loaded %s from %s: read %.1f MiB of their %.1f MiB%s",
        rank,
        name,
        weights.describe(),
        reader.bytes_read / 2**20,
        weights.total_bytes / 2**20,
        f"; {len(names.renamed)} names renamed by {names.via}" if names.renamed else "",
    )
    return {}

"""Which checkpoint format a path is, in one place: ``format_of``, and the verbs that use it.

Every reader goes through ``format_of``: ``ctx.load`` (``load_state``), ``load_weights`` and
``ckpt convert`` (``read_weights`` / ``open_model``), ``ckpt inspect`` (``summarize``). It
recognises, in this order:

- a multigpu checkpoint (``native/``): a directory with ``manifest.json`` or ``state.pt`` (one
  ``ctx.save`` or ``step-*`` checkpoint), or a directory of ``step-*`` ones;
- a plain DCP checkpoint: a directory with ``.metadata``, or that file;
- hub-format weights: a ``.safetensors`` file, or a directory with ``model.safetensors`` or its
  index;
- a ``torch.save`` file: any other file (not for ``ctx.load``);

and says in one line why anything else is none (a missing path, one ``.distcp`` file, a DCP save
that did not finish, a directory without a checkpoint). What each caller accepts and how it
says so differs (``Purpose``); the formats themselves are in ``formats/``.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from multigpu.checkpoint.formats.base import CheckpointFormat, ModelSource, not_a_directory
from multigpu.checkpoint.formats.dcp_format import DcpFormat
from multigpu.checkpoint.formats.hub import SUFFIX, is_hub
from multigpu.checkpoint.formats.hub_format import HubFormat
from multigpu.checkpoint.formats.native_format import NativeFormat, is_root
from multigpu.checkpoint.formats.torch_format import TorchFileFormat
from multigpu.checkpoint.native.layout import (
    METADATA_FILE,
    complete_checkpoint,
    find_latest,
    list_checkpoints,
)
from multigpu.checkpoint.native.saving import decided_by_rank0
from multigpu.checkpoint.native.snapshot import StateAdapter
from multigpu.errors import CheckpointUnreadableError, UsageError

Purpose = Literal["state", "weights", "inspect"]
"""Who asks: ``state`` (``ctx.load``: our checkpoints, DCP, hub weights; the complete one),
``weights`` (``load_weights``, ``ckpt convert``: any format; the complete one), ``inspect``
(``ckpt inspect``: any format; a directory of checkpoints as it is, complete or not)."""

FORMATS: dict[str, CheckpointFormat] = {
    f.name: f for f in (NativeFormat(), DcpFormat(), HubFormat(), TorchFileFormat())
}
"""Every format, by name."""


@dataclass(frozen=True)
class Found:
    """A path's format and what to read: a complete checkpoint's directory (``multigpu``; for
    ``inspect`` the path given), a DCP directory, a safetensors file or directory, a file."""

    kind: str
    """The format's name: ``multigpu``, ``dcp``, ``hub`` or ``torch``."""
    path: Path

    @property
    def format(self) -> CheckpointFormat:
        """The format's implementation."""
        return FORMATS[self.kind]


def format_of(path: str | os.PathLike[str], *, purpose: Purpose = "weights") -> Found:
    """The format of ``path`` and what to read there; else the one-line error ``purpose``'s
    caller has always given (a UsageError or a CheckpointUnreadableError)."""
    p = Path(path)
    state = purpose == "state"
    if state and not p.exists():
        raise not_a_directory(p)
    if not p.exists():
        raise UsageError(f"{p} does not exist; expected a checkpoint file or directory")
    if p.is_file():
        if p.name == METADATA_FILE:  # DCP's index stands for its checkpoint: the directory
            p = p.parent
        elif state:
            if p.name.endswith(SUFFIX):
                return Found("hub", p)
            raise not_a_directory(p)
        elif p.suffix == ".distcp":
            raise UsageError(
                f"{p} is one file of a sharded (DCP) checkpoint; pass its directory {p.parent}"
            )
        else:
            return Found("hub" if is_hub(p) else "torch", p)
    if not is_root(p):  # one checkpoint of ours
        return Found("multigpu", p if purpose == "inspect" else complete_checkpoint(p))
    if (p / METADATA_FILE).is_file():
        return Found("dcp", p)
    if is_hub(p):
        return Found("hub", p)
    if list_checkpoints(p, checksums=False):
        if purpose == "inspect":
            return Found("multigpu", p)
        latest = find_latest(p)
        if latest is None:
            held = "no complete checkpoint" if state else "checkpoints but none is complete"
            raise CheckpointUnreadableError(f"{p} holds {held}; see 'multigpu ckpt inspect {p}'")
        return Found("multigpu", latest.path)
    unfinished = unfinished_dcp(p)
    if unfinished is not None:
        raise unfinished
    if state:
        raise CheckpointUnreadableError(
            f"{p} holds no complete checkpoint; see 'multigpu ckpt inspect {p}'"
        )
    if purpose == "inspect":
        raise UsageError(f"{p} is a directory without checkpoints; expected step-* inside")
    raise UsageError(
        f"{p} is a directory without a checkpoint; expected a step-XXXXXXXX directory, a "
        "directory of them, a DCP checkpoint directory (with .metadata), a directory of "
        "safetensors weights (model.safetensors or its index), or a file"
    )


def unfinished_dcp(path: Path) -> CheckpointUnreadableError | None:
    """The error for a directory of DCP shard files without the index DCP writes last (a save
    that did not finish, a copy without it); None when ``path`` is not one."""
    shards = sorted(p.name for p in path.glob("*.distcp")) if path.is_dir() else []
    if not shards or (path / METADATA_FILE).exists():
        return None
    listed = ", ".join(shards[:2]) + (", ..." if len(shards) > 2 else "")
    return CheckpointUnreadableError(
        f"{path} holds DCP shard files ({listed}) but no {METADATA_FILE}, which "
        "torch.distributed.checkpoint.save writes last: a save that did not finish, or a copy "
        "without it; take another checkpoint, or copy it whole"
    )


def load_state(
    path: str | os.PathLike[str],
    state: MutableMapping[str, Any],
    adapter: StateAdapter,
    *,
    rank: int,
) -> dict[str, Any]:
    """``ctx.load``: fill ``state`` from the checkpoint at ``path`` (collective: rank 0 finds
    its format, every rank gets the answer or the error); return the saved entries ``state``
    did not ask for."""
    found = decided_by_rank0(rank, lambda: format_of(path, purpose="state"))
    return found.format.load(found.path, state, adapter, rank=rank)


def open_model(path: str | os.PathLike[str], *, key: str | None, trust: bool) -> ModelSource:
    """The model in ``path`` (anything ``load_weights`` reads) as a ``ModelSource``."""
    found = format_of(path)
    return found.format.open_model(found.path, key=key, trust=trust)


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
    found = format_of(path, purpose="inspect")
    return found.format.summarize(found.path, trust=trust)

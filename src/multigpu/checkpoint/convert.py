"""``multigpu ckpt convert``: between one plain file and a sharded (DCP) checkpoint.

- to a file: the chosen model of any checkpoint becomes one plain state dict (CPU tensors, no
  wrapper prefixes) for ``model.load_state_dict``, or a ``.safetensors`` file;
- to DCP (``--to dcp``): a plain state dict becomes a complete checkpoint directory holding it
  as one model object, which ``ctx.load`` and a ``Checkpointer`` resume.

Both read the model (never an optimizer) into one process's memory and write atomically:
nothing is left at the destination when they fail. The hub layout (``--to safetensors``),
streamed a tensor at a time, is ``hub_export``'s.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from multigpu.checkpoint.formats.hub import SUFFIX, safetensors_module, unshared
from multigpu.checkpoint.native.layout import MANIFEST_FILE, TMP_PREFIX
from multigpu.checkpoint.native.saving import SaveJob, save
from multigpu.checkpoint.portable import read_weights
from multigpu.common.atomic_file import atomic_write
from multigpu.errors import UsageError


def read_plain(
    src: str | os.PathLike[str], *, key: str | None, trust: bool
) -> tuple[dict[str, torch.Tensor], str]:
    """The model state dict in ``src`` (any checkpoint, safetensors too) and where it came from."""
    if str(src).endswith(SUFFIX) and Path(src).is_file():
        safetensors_module()  # said before the file is looked at
    found, report = read_weights(src, key=key, trust=trust)
    # Our own copy, in place, so the state dict keeps its _metadata (per-module versions).
    for name, value in found.items():
        if isinstance(value, torch.Tensor):
            found[name] = value.detach().cpu().contiguous()
    return found, str(report)


def _check_destination(dst: Path, *, force: bool, directory: bool) -> None:
    if not dst.exists():
        return
    if not force:
        raise UsageError(f"{dst} exists; expected a new path; pass --force to overwrite it")
    if directory and not (dst.is_dir() and (dst / MANIFEST_FILE).is_file()):
        raise UsageError(
            f"{dst} exists and is not a multigpu checkpoint; --force replaces only a checkpoint: "
            "choose a new path"
        )
    if not directory and dst.is_dir():
        raise UsageError(f"{dst} is a directory; expected a file path such as {dst}/model.pt")


def to_file(
    src: str | os.PathLike[str], dst: Path, *, key: str | None, trust: bool, force: bool
) -> str:
    """Write ``src``'s model to the file ``dst`` (``.safetensors``: safetensors); say what."""
    _check_destination(dst, force=force, directory=False)
    writer = safetensors_module() if str(dst).endswith(SUFFIX) else None  # before reading
    state, report = read_plain(src, key=key, trust=trust)
    if writer is not None:
        tensors = unshared(state)
        data = writer.save(tensors)
        atomic_write(dst, lambda fh: fh.write(data))
        if len(tensors) < len(state):  # safetensors holds tensors only
            dropped = sorted(k for k in state if k not in tensors)
            report += f"; left out {len(dropped)} non-tensor entries ({', '.join(dropped[:3])})"
    else:
        atomic_write(dst, lambda fh: torch.save(state, fh))
    return report


class _StateAsModule(nn.Module):
    """A state dict in the place of the model it came from: what ``saving`` is given to save."""

    def __init__(self, state: Mapping[str, torch.Tensor]) -> None:
        super().__init__()
        self.held = dict(state)


class _AsSaved:
    """The state source of a conversion: a held state dict is the model's state, as it is."""

    def model_state(self, module: nn.Module) -> dict[str, Any]:
        assert isinstance(module, _StateAsModule)
        return module.held

    def optimizer_state(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, *, initialise: bool = False
    ) -> dict[str, Any]:
        raise UsageError("a conversion writes a model's weights only, no optimizer state")


def to_dcp(
    src: str | os.PathLike[str],
    dst: Path,
    *,
    key: str | None,
    name: str,
    trust: bool,
    force: bool,
) -> str:
    """Write ``src``'s model as the object ``name`` of a new checkpoint directory ``dst``."""
    if not name.isidentifier():
        raise UsageError(f"--name {name!r} is not an identifier; give e.g. --name model")
    _check_destination(dst, force=force, directory=True)
    state, report = read_plain(src, key=key, trust=trust)
    job = SaveJob(
        final=dst,
        stale=f"{TMP_PREFIX}{dst.name}-*",
        step=0,
        epoch=None,
        rank=0,
        world_size=1,
        objects={name: _StateAsModule(state)},
        rng=False,
        adapter=_AsSaved(),
        strategy={"strategy": "converted", "from": str(src)},
    )
    try:
        save(job)
    finally:  # a dead save's temp dir too: a conversion has no next save to remove it
        for stale in dst.parent.glob(f"{TMP_PREFIX}{dst.name}-*"):
            shutil.rmtree(stale, ignore_errors=True)
    return f"{report}; as object {name!r} of a sharded (DCP) checkpoint"

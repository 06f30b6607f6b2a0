"""``ckpt convert --to safetensors``: a checkpoint's model in the Hugging Face hub layout.

``DST/`` gets ``model.safetensors`` — or, past ``max_shard_size``, ``model-0000N-of-0000M
.safetensors`` and ``model.safetensors.index.json`` — split as ``transformers``'
``save_pretrained`` splits (in the checkpoint's order, a new file when the next tensor would
pass the limit, a larger tensor alone in its own), plus the given ``config.json``. Tensors are
read one at a time from a sharded checkpoint and written a file at a time: the memory it takes
is about one output file (``benchmarks/export_memory.py``).

With a ``config.json`` naming an architecture ``transformers`` has, that model is built on the
meta device (no memory; ``hub_config``), the checkpoint must hold its tensors (names, shapes),
and the files are what its ``save_pretrained`` writes: tied weights
once — its parameters shared under several names (GPT-2's ``lm_head.weight`` and
``transformer.wte.weight``) show which names to leave out, and the checkpoint's tensors under
those names must be equal, else the export is refused — and the hub format's own names, where
transformers 5's modules differ from them (its conversion mapping, reversed: ``hub_names``).
Without a config the checkpoint's names are written as they are. ``transformers`` is imported
(by ``hub_config``) only to build that model, and only then. ``force`` writes into an existing
model directory: the files written replace theirs, the others (a README, the tokenizer's) stay.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import re
import secrets
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from multigpu.checkpoint.dispatch import open_model
from multigpu.checkpoint.formats.base import ModelSource
from multigpu.checkpoint.formats.hub import (
    CONFIG_FILE,
    INDEX_FILE,
    SINGLE_FILE,
    safetensors_module,
    unshared,
)
from multigpu.checkpoint.formats.hub_config import check_fits, config_model, read_config
from multigpu.checkpoint.formats.hub_names import HubNames, hub_names
from multigpu.checkpoint.native.layout import MANIFEST_FILE, METADATA_FILE, TMP_PREFIX
from multigpu.checkpoint.native.writer import fsync_dir, write_small
from multigpu.errors import CheckpointError, UsageError
from multigpu.runtime.wrappers import tied_names

log = logging.getLogger(__name__)

DEFAULT_MAX_SHARD_SIZE = "5GB"
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS.update({"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40})
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes in ``text``: a whole number, or a number and a unit as ``transformers`` takes them
    (``KB``/``MB``/``GB``/``TB``: powers of 1000; ``KiB``/``MiB``/``GiB``/``TiB``: of 1024).

    Example:
        >>> parse_size("5GB"), parse_size("1.5MiB"), parse_size(4096)
        (5000000000, 1572864, 4096)
    """
    if isinstance(text, int) and not isinstance(text, bool):
        value: float = text
    else:
        match = _SIZE.match(str(text))
        unit = match.group(2).upper() if match else ""
        if match is None or unit not in _UNITS:
            raise UsageError(
                f"shard size {text!r} is not a size; expected bytes or a number with KB, MB, GB "
                "(or KiB, MiB, GiB), e.g. 5GB"
            )
        value = float(match.group(1)) * _UNITS[unit]
    if value < 1:
        raise UsageError(f"shard size {text!r} is below one byte; expected e.g. 5GB")
    return int(value)


def plan_shards(sizes: Mapping[str, int], max_bytes: int) -> list[list[str]]:
    """The names in each output file, as ``huggingface_hub``'s splitter groups them.

    Example:
        >>> plan_shards({"a": 6, "b": 6, "c": 2, "d": 12, "e": 2}, 10)
        [['a'], ['d'], ['b', 'c', 'e']]
    """
    shards: list[list[str]] = []
    current: list[str] = []
    used = 0
    for name, size in sizes.items():
        if size > max_bytes:
            shards.append([name])
            continue
        if used + size > max_bytes and current:
            shards.append(current)
            current, used = [], 0
        current.append(name)
        used += size
    if current:
        shards.append(current)
    return shards


def shard_file(index: int, count: int) -> str:
    """The file name of shard ``index`` (0-based) of ``count``, as ``transformers`` names it."""
    return SINGLE_FILE if count == 1 else f"model-{index + 1:05d}-of-{count:05d}.safetensors"


def _digest(tensor: torch.Tensor) -> str:
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    return f"{tensor.dtype}{tuple(tensor.shape)}" + hashlib.sha256(flat.numpy().data).hexdigest()


_OURS = re.compile(r"^model(-\d{5}-of-\d{5})?\.safetensors$")
"""The weight files of an export (or of ``save_pretrained``): those ``--force`` replaces."""


def _check_destination(dst: Path, force: bool) -> None:
    """Refuse, before anything is read, a destination the export must not write into."""
    if not dst.exists():
        return
    if not force:
        raise UsageError(f"{dst} exists; expected a new directory; pass --force to write into it")
    if not dst.is_dir():
        raise UsageError(f"{dst} exists and is not a directory; expected a model directory")
    if (dst / MANIFEST_FILE).exists() or (dst / METADATA_FILE).exists():
        raise UsageError(
            f"{dst} is a checkpoint; --force writes a model into a model directory, keeping its "
            "other files: choose a new path"
        )
    for name in (SINGLE_FILE, INDEX_FILE, CONFIG_FILE):
        if (dst / name).exists() and not (dst / name).is_file():
            raise UsageError(
                f"{dst / name} is in the way (not a file); the export writes a file there: move "
                "it, or choose a new path"
            )


def export_hub(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    key: str | None = None,
    config: str | os.PathLike[str] | None = None,
    max_shard_size: str | int = DEFAULT_MAX_SHARD_SIZE,
    trust: bool = False,
    force: bool = False,
) -> str:
    """Write the model of ``src`` to the directory ``dst`` in the hub layout; say what was done.

    Atomic: the files are written in a temporary directory beside ``dst``, renamed to ``dst``
    when complete; on any failure nothing is left at ``dst``. Into an existing directory (with
    ``force``), once complete, each file written replaces the one of its name (a rename), an
    earlier export's weight files not written again are removed, and every other file (a
    README, the tokenizer's, ``config.json`` when no ``config`` is given) is kept.

    With a ``config`` whose model ``transformers`` builds, the checkpoint must be that model's:
    names it lacks or does not have, or shapes that differ, are refused before anything is
    written (``hub_config.check_fits``).

    Args:
        src: anything ``multigpu.load_weights`` reads; a multigpu or plain DCP checkpoint is
            read one tensor at a time.
        dst: the directory to write (``model.safetensors``, or the shards and their index).
        key: which object of ``src`` holds the model, when several could.
        config: the model's ``config.json``, copied into ``dst``; with ``transformers``
            installed the checkpoint is checked against its model, whose tied weights are
            written once under the names ``save_pretrained`` writes (without it: the
            checkpoint's names, as they are).
        max_shard_size: the largest output file: bytes, or ``"5GB"``, ``"500MiB"``...
        trust: allow a legacy pickle / an index naming other classes (runs code).
        force: write into an existing directory ``dst`` (not a checkpoint), keeping the files
            the export does not write.

    Raises:
        UsageError: bad arguments or an unusable destination (nothing read yet), or a
            config whose hub names need a conversion of the tensors (not a rename).
        CheckpointMismatchError: the config's model is not the checkpoint's.
        CheckpointError: ``src`` cannot be read, or its tied weights differ.
    """
    target = Path(dst)
    limit = parse_size(max_shard_size)
    settings = read_config(config) if config is not None else None
    _check_destination(target, force)
    writer = safetensors_module()  # refused before anything is read
    model = open_model(src, key=key, trust=trust)
    if not model.shapes:
        raise UsageError(f"{src} holds no tensors for its model; nothing to export")
    built, note = config_model(settings)
    if built is not None and config is not None:
        note = check_fits(built, model.shapes, config=config, source=model.source)
    tied = tied_names(built) if built is not None else {}
    dropped = {n: k for n, k in tied.items() if n in model.shapes and k in model.shapes}
    names = [n for n in model.shapes if n not in dropped]
    named = hub_names(built, names) if built is not None else HubNames(names, {})
    kept = {n: model.nbytes(n) for n in named.order}
    shards = plan_shards(kept, limit)
    for number in range(len(shards)):
        _check_destination_file(target / shard_file(number, len(shards)))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f"{TMP_PREFIX}{target.name}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        _write_shards(tmp, model, shards, dropped, named.written, writer)
        if len(shards) > 1:
            metadata = {"total_size": sum(kept.values())}
            if built is not None:  # as save_pretrained counts: parameters (not buffers), once
                buffers = {n for n, _ in built.named_buffers()}
                metadata["total_parameters"] = sum(
                    math.prod(model.shapes[n][0]) for n in kept if n not in buffers
                )
            index = {
                "metadata": metadata,
                "weight_map": {
                    named.written.get(n, n): shard_file(i, len(shards))
                    for i, s in enumerate(shards)
                    for n in s
                },
            }
            write_small(tmp / INDEX_FILE, json.dumps(index, indent=2, sort_keys=True) + "\n")
        if config is not None:
            shutil.copyfile(config, tmp / CONFIG_FILE)
        fsync_dir(tmp)
        kept_files = _replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    said = [f"{sum(len(s) for s in shards)} tensors from {model.source}"]
    said.append(f"{len(shards)} safetensors file{'s' if len(shards) > 1 else ''}")
    if dropped:
        said.append("tied, written once: " + ", ".join(f"{n} (= {k})" for n, k in dropped.items()))
    if named.note:
        said.append(named.note)
    if model.skipped:
        said.append(f"left out {len(model.skipped)} non-tensor entries ({model.skipped[0]}, ...)")
    if note:
        said.append(note)
    if config is not None:
        said.append(f"with {CONFIG_FILE}")
    if kept_files:
        said.append(f"kept the {len(kept_files)} other files there ({', '.join(kept_files[:3])}"
                    f"{', ...' if len(kept_files) > 3 else ''})")  # fmt: skip
    return "; ".join(said)


def _write_shards(
    tmp: Path,
    model: ModelSource,
    shards: list[list[str]],
    dropped: Mapping[str, str],
    written: Mapping[str, str],
    writer: Any,
) -> None:
    """Each shard's tensors, read one at a time, then written as one safetensors file (under
    ``written``'s name where it has one). A tied name is read too (its digest compared), never
    kept."""
    sources = set(dropped.values())
    digests: dict[str, str] = {}
    pending = dict(dropped)
    for index, names in enumerate(shards):
        tensors: dict[str, torch.Tensor] = {}
        for name, tensor in model.read(names):
            tensors[written.get(name, name)] = tensor = tensor.contiguous()
            if name in sources:
                digests[name] = _digest(tensor)
        file = tmp / shard_file(index, len(shards))
        # unshared: tied weights of a file read whole, written under both names when no config
        # says they are tied, share one memory, which safetensors refuses.
        writer.save_file(unshared(tensors), str(file), metadata={"format": "pt"})
        with open(file, "rb") as fh:
            os.fsync(fh.fileno())
        del tensors
        ready = [n for n, k in pending.items() if k in digests]
        for name, tensor in model.read(ready):
            if _digest(tensor) != digests[pending[name]]:
                raise CheckpointError(
                    f"{name} differs from {pending[name]} in the checkpoint, but the config's "
                    "model ties them (one tensor under both names): exported, one would replace "
                    "the other; check --config (tie_word_embeddings) against the trained model"
                )
            del pending[name]


def _check_destination_file(path: Path) -> None:
    if path.exists() and not path.is_file():
        raise UsageError(
            f"{path} is in the way (not a file); the export writes a file there: move it, or "
            "choose a new path"
        )


def _replace(tmp: Path, final: Path) -> list[str]:
    """Make ``tmp``'s files those of ``final``: a new ``final`` is ``tmp`` renamed; into an
    existing one (``--force``), each file is moved in (replacing one of that name atomically),
    and the weight files of an earlier export it does not write again (``model.safetensors``,
    shards, index) are removed, so that no loader mixes the two. Every other file (a README,
    the tokenizer's) stays. Returns the names of those kept (sorted)."""
    if not final.exists():
        os.replace(tmp, final)
        fsync_dir(final.parent)
        return []
    written = sorted(p.name for p in tmp.iterdir())
    weights = [n for n in written if n != INDEX_FILE and n != CONFIG_FILE]
    for name in weights:  # the weights first, the index naming them after
        os.replace(tmp / name, final / name)
    if (tmp / INDEX_FILE).exists():
        os.replace(tmp / INDEX_FILE, final / INDEX_FILE)
    else:
        with contextlib.suppress(FileNotFoundError):
            (final / INDEX_FILE).unlink()  # an earlier sharded export's: it would be read first
    for old in final.iterdir():
        if _OURS.match(old.name) and old.name not in written and old.is_file():
            old.unlink()  # an earlier export's shard, named in no index now
    if (tmp / CONFIG_FILE).exists():
        os.replace(tmp / CONFIG_FILE, final / CONFIG_FILE)
    fsync_dir(final)
    tmp.rmdir()
    return sorted(p.name for p in final.iterdir() if p.name not in written)

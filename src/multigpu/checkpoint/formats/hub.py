"""Weights in the Hugging Face hub format: safetensors files, one or sharded behind an index.

A hub model directory holds ``model.safetensors``, or ``model-00001-of-0000N.safetensors`` ...
and ``model.safetensors.index.json`` (``{"metadata": {"total_size": bytes}, "weight_map":
{tensor name: file}}``), beside its ``config.json``. The ``safetensors`` package is imported here
only, when a file is read or written (``pip install 'multigpu[safetensors]'``): ``import
multigpu`` never needs it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from multigpu.errors import CheckpointError, CheckpointUnreadableError, UsageError

SUFFIX = ".safetensors"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
"""safetensors' dtype names (its header's ``dtype``) as torch dtypes."""


def safetensors_module() -> Any:
    """``safetensors.torch``, or a UsageError saying how to install it."""
    try:
        import safetensors.torch
    except ImportError as e:
        raise UsageError(
            "safetensors files need the safetensors package, which is not installed; run "
            "pip install 'multigpu[safetensors]' (or use a .pt path)"
        ) from e
    return safetensors.torch


def _safe_open(file: Path) -> Any:
    safetensors_module()
    from safetensors import safe_open

    try:
        return safe_open(str(file), framework="pt", device="cpu")
    except Exception as e:  # the Rust reader raises its own SafetensorError for a bad header
        raise CheckpointUnreadableError(
            f"{file} is not a readable safetensors file ({type(e).__name__}: "
            f"{' '.join(str(e).split())[:160]}); expected a complete file written by safetensors"
        ) from e


def is_hub(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a ``.safetensors`` file or a directory of hub-format weights."""
    p = Path(path)
    if p.is_file():
        return p.name.endswith(SUFFIX)
    return (p / INDEX_FILE).is_file() or (p / SINGLE_FILE).is_file()


@dataclass(frozen=True)
class HubWeights:
    """The tensors of a hub-format source, from the files' headers (no tensor data read)."""

    path: Path
    """The file or directory given."""
    files: dict[str, Path]
    """{tensor name: the file holding it}."""
    shapes: dict[str, tuple[int, ...]]
    """{tensor name: shape}."""
    dtypes: dict[str, torch.dtype]
    """{tensor name: dtype}."""

    @property
    def total_bytes(self) -> int:
        """Bytes of every tensor together."""
        return sum(_numel(s) * self.dtypes[k].itemsize for k, s in self.shapes.items())

    @property
    def kind(self) -> str:
        """``safetensors (N files)``."""
        files = len(set(self.files.values()))
        return f"safetensors ({files} file{'s' if files > 1 else ''})"

    def describe(self) -> str:
        """Where the tensors come from, for a report line: the kind and the path."""
        return f"{self.kind} ({self.path})"


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _weight_map(directory: Path) -> dict[str, Path]:
    index = directory / INDEX_FILE
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
        ):
            raise TypeError("weight_map is not {tensor name: file name}")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointUnreadableError(
            f"{index} is not a safetensors index ({type(e).__name__}: {e}); expected "
            '{"weight_map": {tensor name: file}} as transformers writes it'
        ) from e
    files = {name: directory / file for name, file in weight_map.items()}
    missing = sorted({str(f.name) for f in files.values() if not f.is_file()})
    if missing:
        raise CheckpointUnreadableError(
            f"{index} names files that are not in {directory}: {', '.join(missing[:3])}; "
            "download or copy every shard the index lists"
        )
    return files


def open_hub(path: str | os.PathLike[str]) -> HubWeights:
    """The tensors of a ``.safetensors`` file or a hub directory, from their headers."""
    p = Path(path)
    if p.is_dir():
        if (p / INDEX_FILE).is_file():
            by_name = _weight_map(p)
        else:
            by_name = {name: p / SINGLE_FILE for name in _names(p / SINGLE_FILE)}
    else:
        by_name = {name: p for name in _names(p)}
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, torch.dtype] = {}
    for file in dict.fromkeys(by_name.values()):
        with _safe_open(file) as handle:
            held = set(handle.keys())
            for name in (n for n, f in by_name.items() if f == file):
                if name not in held:
                    raise CheckpointUnreadableError(
                        f"the index of {p} puts {name} in {file.name}, which does not hold it; "
                        "the index and the shards are from different saves"
                    )
                piece = handle.get_slice(name)
                shapes[name] = tuple(int(d) for d in piece.get_shape())
                dtypes[name] = _dtype(piece.get_dtype(), name, file)
    shapes = {name: shapes[name] for name in by_name}  # the index's (or the file's) order
    return HubWeights(path=p, files=by_name, shapes=shapes, dtypes=dtypes)


def _names(file: Path) -> list[str]:
    with _safe_open(file) as handle:
        return list(handle.keys())


def _dtype(name: str, tensor: str, file: Path) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise CheckpointError(
            f"{file} stores {tensor} as {name}, a dtype multigpu does not read; expected one of "
            f"{', '.join(DTYPES)}"
        ) from None


def read_hub(weights: HubWeights) -> dict[str, torch.Tensor]:
    """Every tensor of ``weights``, whole, on the CPU (file by file)."""
    return dict(stream_hub(weights, list(weights.files)))


def stream_hub(weights: HubWeights, names: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for each of ``names``, read one at a time, each file opened once."""
    by_file: dict[Path, list[str]] = {}
    for name in names:
        by_file.setdefault(weights.files[name], []).append(name)
    for file, held in by_file.items():
        with _safe_open(file) as handle:
            for name in held:
                yield name, handle.get_tensor(name)


def read_slice(handle: Any, name: str, index: tuple[slice, ...]) -> torch.Tensor:
    """The part ``index`` of tensor ``name`` in an open file: only those bytes are read."""
    return handle.get_slice(name)[index]


def open_file(file: Path) -> Any:
    """An open safetensors file (a context manager): ``keys()``, ``get_slice(name)``."""
    return _safe_open(file)


def unshared(state: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The tensors of ``state``, each with memory of its own: safetensors refuses tensors that
    share storage (tied weights: an embedding and its output layer), torch.save keeps one."""
    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            continue
        storage = value.untyped_storage().data_ptr()
        if storage in seen and value.numel():
            value = value.clone()
        seen.add(storage)
        out[name] = value
    return out

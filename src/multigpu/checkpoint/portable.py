"""Portable weights: load any common checkpoint into a model, on any device, saying what changed.

Accepted: multigpu checkpoints (a checkpoint directory, one ``step-*`` directory, its
``state.pt``), plain state dicts, state dicts nested under a usual key (``state_dict``,
``model_state_dict``, ``model``, ``module``, ``net``), saved from DataParallel / DDP (``module.``
keys), from ``torch.compile`` (``_orig_mod.``) or on CUDA (loaded on the CPU). Files are read
with ``weights_only=True``; a legacy pickle needs ``trust=True``, because unpickling it can run
any code the file holds.

Environment variables read: none.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from multigpu.checkpoint.layout import (
    FORMAT,
    MANIFEST_FILE,
    STATE_FILE,
    find_latest,
    list_checkpoints,
    verify_checkpoint,
)
from multigpu.errors import CheckpointError, UsageError
from multigpu.wrappers import unwrap_module

log = logging.getLogger(__name__)

PREFIXES = ("module.", "_orig_mod.")
"""Key prefixes added by DataParallel/DDP and by torch.compile."""
NESTED_KEYS = ("state_dict", "model_state_dict", "model", "module", "net")
"""Where training scripts usually put the model's state dict inside a checkpoint dict."""


@dataclass(frozen=True)
class LoadReport:
    """What ``load_weights`` / ``read_weights`` found and changed; ``str()`` is one line."""

    path: Path
    source: str
    tensors: int
    prefixes_stripped: tuple[str, ...] = ()
    devices_mapped: Mapping[str, str] = field(default_factory=dict)
    missing_keys: tuple[str, ...] = ()
    unexpected_keys: tuple[str, ...] = ()
    trusted: bool = False

    def __str__(self) -> str:
        parts = [f"{self.tensors} tensors from {self.source} ({self.path})"]
        if self.prefixes_stripped:
            parts.append("stripped " + ", ".join(repr(p) for p in self.prefixes_stripped))
        if self.devices_mapped:
            parts.append(
                "mapped " + ", ".join(f"{a} -> {b}" for a, b in sorted(self.devices_mapped.items()))
            )
        if self.missing_keys:
            parts.append(f"missing {len(self.missing_keys)}: {', '.join(self.missing_keys[:5])}")
        if self.unexpected_keys:
            parts.append(
                f"unexpected {len(self.unexpected_keys)}: {', '.join(self.unexpected_keys[:5])}"
            )
        if self.trusted:
            parts.append("loaded as a trusted pickle")
        return "; ".join(parts)


def load_file(
    path: Path, *, trust: bool = False, map_location: str | torch.device = "cpu"
) -> tuple[Any, dict[str, str]]:
    """``torch.load`` a file; return the object and ``{recorded device: device loaded to}``.

    Raises:
        CheckpointError: a legacy pickle without ``trust``, or not a PyTorch file.
    """
    seen: Counter[str] = Counter()
    target = torch.device(map_location)

    def record(storage: Any, location: str) -> Any:
        seen[location] += 1  # the device the file says this storage was saved from
        return storage if target.type == "cpu" else storage.to(target)

    try:
        obj = torch.load(path, map_location=record, weights_only=not trust)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"{path} is a legacy pickle that weights_only loading refuses{_why(e)}; "
            "unpickling it can run any code it holds: if you trust its source, pass trust=True "
            "(CLI: --trust)"
        ) from e
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise CheckpointError(
            f"{path} is not a readable PyTorch file ({type(e).__name__}: {e}); expected a file "
            "written by torch.save or a multigpu checkpoint"
        ) from e
    mapped = {loc: str(target) for loc in seen if loc != str(target)}
    return obj, mapped


def _why(error: Exception) -> str:
    """The "Unsupported global: GLOBAL module.Class" part of torch's long message, if any."""
    for line in str(error).splitlines():
        if "Unsupported global" in line or "Unsupported operand" in line:
            text = line.strip().removeprefix("WeightsUnpickler error: ")
            return f" ({text.split(' was not', 1)[0]})"
    return ""


def resolve(path: str | os.PathLike[str]) -> Path:
    """The file to read for ``path``: a checkpoint root → its newest complete ``state.pt``.

    Raises:
        UsageError: the path does not exist or is a directory that holds no checkpoint.
        CheckpointError: the checkpoint is incomplete or corrupt (its problems named).
    """
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{p} does not exist; expected a checkpoint file or directory")
    if p.is_file():
        return p
    if (p / MANIFEST_FILE).exists() or (p / STATE_FILE).exists():
        status = verify_checkpoint(p)
        if not status.complete:
            raise CheckpointError(f"checkpoint {p} is not usable: {'; '.join(status.problems)}")
        return p / STATE_FILE
    if list_checkpoints(p, checksums=False):
        latest = find_latest(p)
        if latest is None:
            raise CheckpointError(f"{p} holds checkpoints but none is complete")
        return latest.path / STATE_FILE
    raise UsageError(
        f"{p} is a directory without a checkpoint; expected a step-XXXXXXXX directory, a "
        "directory of them, or a file"
    )


def _is_tensor_dict(obj: Any) -> bool:
    return (
        isinstance(obj, Mapping)
        and bool(obj)
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())
    )


def _module_kinds(state_file: Path) -> dict[str, str]:
    manifest = state_file.parent / MANIFEST_FILE
    try:
        objects = json.loads(manifest.read_text()).get("objects", {})
        return {name: info.get("kind", "object") for name, info in objects.items()}
    except (OSError, ValueError, AttributeError):
        return {}


def extract_state_dict(obj: Any, state_file: Path, key: str | None) -> tuple[dict[str, Any], str]:
    """Find the model's state dict inside a loaded object; return it and where it was.

    Raises:
        UsageError: ``key`` is not there, or the choice is ambiguous (the candidates named).
    """
    if isinstance(obj, Mapping) and obj.get("format") == FORMAT and "objects" in obj:
        objects = obj["objects"]
        step = obj.get("step")
        if key is not None:
            if key not in objects:
                raise UsageError(
                    f"key={key!r} is not in the checkpoint; it holds {sorted(objects)}"
                )
            return dict(objects[key]), f"multigpu checkpoint step {step}, object {key!r}"
        kinds = _module_kinds(state_file)
        modules = [n for n, v in objects.items() if kinds.get(n) == "module"] or [
            n for n, v in objects.items() if _is_tensor_dict(v)
        ]
        if "model" in modules:
            modules = ["model"]
        if len(modules) != 1:
            raise UsageError(
                f"the checkpoint holds {len(modules)} models ({', '.join(modules) or 'none'}); "
                "pass key=NAME (CLI: --key NAME) to choose one"
            )
        return dict(objects[modules[0]]), f"multigpu checkpoint step {step}, object {modules[0]!r}"
    if key is not None:
        if not isinstance(obj, Mapping) or key not in obj:
            have = sorted(obj) if isinstance(obj, Mapping) else type(obj).__name__
            raise UsageError(f"key={key!r} is not in {state_file}; it holds {have}")
        return dict(obj[key]), f"dict key {key!r}"
    if _is_tensor_dict(obj):
        return dict(obj), "plain state dict"
    if isinstance(obj, Mapping):
        nested = [k for k in NESTED_KEYS if _is_tensor_dict(obj.get(k))]
        if len(nested) == 1:
            return dict(obj[nested[0]]), f"dict key {nested[0]!r}"
        keys = sorted(str(k) for k in obj)
        raise UsageError(
            f"{state_file} holds a dict with keys {keys[:10]} and no single state dict; pass "
            "key=NAME (CLI: --key NAME) to choose one"
        )
    raise UsageError(f"{state_file} holds a {type(obj).__name__}, not a state dict")


def strip_common_prefixes(state: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Strip ``module.`` / ``_orig_mod.`` while EVERY key starts with the same one.

    Example:
        >>> strip_common_prefixes({"module._orig_mod.w": 1})
        ({'w': 1}, ('module.', '_orig_mod.'))
    """
    out, stripped = dict(state), []
    while out:
        prefix = next((p for p in PREFIXES if all(k.startswith(p) for k in out)), None)
        if prefix is None:
            break
        out = {k[len(prefix) :]: v for k, v in out.items()}
        stripped.append(prefix)
    return out, tuple(stripped)


def _strip_each(key: str) -> str:
    changed = True
    while changed:
        changed = False
        for prefix in PREFIXES:
            if key.startswith(prefix):
                key, changed = key[len(prefix) :], True
    return key


def match_keys(
    state: Mapping[str, Any], wanted: set[str]
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Strip wrapper prefixes from ``state``'s keys only when that matches ``wanted`` better."""
    if set(state) == wanted:
        return dict(state), ()
    candidate = {_strip_each(k): v for k, v in state.items()}
    if len(candidate) == len(state) and len(set(candidate) & wanted) > len(set(state) & wanted):
        stripped = sorted(
            {p for k in state for p in PREFIXES if p in k and _strip_each(k) != k},
            key=PREFIXES.index,
        )
        return candidate, tuple(stripped)
    return dict(state), ()


def read_weights(
    path: str | os.PathLike[str],
    *,
    key: str | None = None,
    trust: bool = False,
    map_location: str | torch.device = "cpu",
) -> tuple[dict[str, Any], LoadReport]:
    """The model state dict in ``path`` (prefixes shared by all keys stripped) and a report."""
    file = resolve(path)
    obj, mapped = load_file(file, trust=trust, map_location=map_location)
    state, source = extract_state_dict(obj, file, key)
    state, stripped = strip_common_prefixes(state)
    report = LoadReport(file, source, len(state), stripped, mapped, trusted=trust)
    return state, report


def load_weights(
    model: nn.Module,
    path: str | os.PathLike[str],
    *,
    key: str | None = None,
    strict: bool = True,
    trust: bool = False,
    map_location: str | torch.device = "cpu",
) -> LoadReport:
    """Load the weights in ``path`` into ``model`` (its plain module, if wrapped).

    Args:
        model: the model (DDP/DP/compiled wrappers are looked through).
        path: a multigpu checkpoint directory / ``step-*`` directory / ``state.pt``, or a file
            holding a state dict, plain or nested under a usual key.
        key: which object or dict key holds the model, when several could.
        strict: every key must match (else missing/unexpected keys are reported).
        trust: allow a legacy pickle (``weights_only=False``): only for files you trust.
        map_location: where tensors go (default CPU, so CUDA-saved files load anywhere).

    Returns:
        A LoadReport saying where the weights came from and what was changed.

    Raises:
        CheckpointError: the file is unreadable, a legacy pickle without ``trust``, or its keys
            or shapes do not fit ``model``.
        UsageError: the path is not a checkpoint, or which model to take is ambiguous.

    Example:
        >>> report = multigpu.load_weights(model, "runs/ckpt")   # doctest: +SKIP
        >>> print(report)  # 4 tensors from multigpu checkpoint step 300, object 'model' (...)
    """
    target = unwrap_module(model)
    file = resolve(path)
    obj, mapped = load_file(file, trust=trust, map_location=map_location)
    state, source = extract_state_dict(obj, file, key)
    state, stripped = match_keys(state, set(target.state_dict()))
    try:
        result = target.load_state_dict(state, strict=strict)
    except RuntimeError as e:
        raise CheckpointError(
            f"the weights in {file} do not fit {type(target).__name__}: {str(e).strip()}"
        ) from e
    report = LoadReport(
        file,
        source,
        len(state),
        stripped,
        mapped,
        tuple(result.missing_keys),
        tuple(result.unexpected_keys),
        trust,
    )
    log.info("load_weights: %s", report)
    return report

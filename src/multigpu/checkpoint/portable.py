"""Portable weights: load any common checkpoint into a model, on any device, saying what changed.

Accepted: multigpu checkpoints (a checkpoint directory, one ``step-*`` directory or a
``ctx.save`` directory, its ``state.pt``; sharded ones are read whole from their DCP files),
plain DCP checkpoints (a directory written by ``torch.distributed.checkpoint.save``, flat or
nested, torchtitan's step directories; or its ``.metadata``), weights in the hub format (a
``.safetensors`` file, or a directory with ``model.safetensors`` or its sharded index), plain
state dicts, state dicts nested under a usual key (``state_dict``, ``model_state_dict``,
``model``, ``module``, ``net``), saved from DataParallel / DDP (``module.`` keys), from
``torch.compile`` (``_orig_mod.``) or on CUDA (loaded on the CPU). Files are read with
``weights_only=True``; a legacy pickle needs ``trust=True`` (see ``formats.torch_file``).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from multigpu.checkpoint.dispatch import format_of
from multigpu.checkpoint.formats.hub import is_hub
from multigpu.checkpoint.formats.hub_names import renamed_state
from multigpu.checkpoint.formats.keys import match_keys, strip_common_prefixes
from multigpu.errors import CheckpointError
from multigpu.runtime.wrappers import tied_names, unwrap_module, with_tied

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class LoadReport:
    """What ``load_weights`` / ``read_weights`` found and changed; ``str()`` is one line.

    Example:
        >>> str(LoadReport(path=Path("m.pt"), source="plain state dict", tensors=4,
        ...                prefixes_stripped=("module.",), devices_mapped={"cuda:0": "cpu"}))
        "4 tensors from plain state dict (m.pt); stripped 'module.'; mapped cuda:0 -> cpu"
    """

    path: Path
    """The file read, or for a multigpu checkpoint its directory (a ``step-*`` one)."""
    source: str
    """Where the weights were found: "plain state dict", "dict key 'state_dict'", ..."""
    tensors: int
    """How many entries the state dict had."""
    prefixes_stripped: tuple[str, ...] = ()
    """Wrapper prefixes removed from the keys, outermost first."""
    devices_mapped: Mapping[str, str] = field(default_factory=dict)
    """{device recorded in the file: device loaded to}, e.g. {"cuda:0": "cpu"}."""
    missing_keys: tuple[str, ...] = ()
    """Model keys the file lacked (only with ``strict=False``)."""
    unexpected_keys: tuple[str, ...] = ()
    """File keys the model lacks (only with ``strict=False``)."""
    dtype_casts: tuple[str, ...] = ()
    """Dtype conversions the model's own dtypes forced, e.g. "float16 -> float32 (4 tensors)"."""
    trusted: bool = False
    """Whether the file was fully unpickled (``trust=True``)."""
    renamed: int = 0
    """How many of the hub-format files' names were renamed to the model's (``hub_names``)."""
    renamed_by: str = ""
    """Whose mapping renamed them: "ViTModel's conversion mapping (transformers 5.2.0)"."""

    def __str__(self) -> str:
        parts = [f"{self.tensors} tensors from {self.source} ({self.path})"]
        if self.prefixes_stripped:
            parts.append("stripped " + ", ".join(repr(p) for p in self.prefixes_stripped))
        if self.devices_mapped:
            parts.append(
                "mapped " + ", ".join(f"{a} -> {b}" for a, b in sorted(self.devices_mapped.items()))
            )
        if self.missing_keys:
            parts.append(f"missing {len(self.missing_keys)}: {_few(self.missing_keys)}")
        if self.unexpected_keys:
            parts.append(f"unexpected {len(self.unexpected_keys)}: {_few(self.unexpected_keys)}")
        if self.renamed:
            parts.append(f"renamed {self.renamed} by {self.renamed_by}")
        if self.dtype_casts:
            parts.append("cast " + ", ".join(self.dtype_casts))
        if self.trusted:
            parts.append("loaded as a trusted pickle")
        return "; ".join(parts)


def _few(names: tuple[str, ...] | list[str], n: int = 5) -> str:
    return ", ".join(names[:n]) + (", ..." if len(names) > n else "")


def _read(
    path: str | os.PathLike[str], key: str | None, trust: bool, map_location: str | torch.device
) -> tuple[Mapping[str, Any], LoadReport]:
    """The model state dict in ``path`` as saved, and the report of reading it (naming a
    multigpu checkpoint's directory, else the file or directory read)."""
    found = format_of(path)
    read = found.format.read_model(found.path, key=key, trust=trust, map_location=map_location)
    return read.state, LoadReport(
        path=read.path,
        source=read.source,
        tensors=len(read.state),
        devices_mapped=read.devices_mapped,
        trusted=read.trusted,
    )


def read_weights(
    path: str | os.PathLike[str],
    *,
    key: str | None = None,
    trust: bool = False,
    map_location: str | torch.device = "cpu",
) -> tuple[dict[str, Any], LoadReport]:
    """The model state dict in ``path`` (prefixes shared by all keys stripped) and a report.

    Without a model to match, only a prefix that EVERY key has is stripped (repeatedly).
    """
    found, report = _read(path, key, trust, map_location)
    state, stripped = strip_common_prefixes(found)  # renames keys, never drops one
    return state, replace(report, prefixes_stripped=stripped)


def _check_fit(
    state: Mapping[str, Any], current: Mapping[str, Any], strict: bool, file: Path, name: str
) -> None:
    """Refuse before anything is copied: torch's load_state_dict copies the matching tensors
    first and raises about the rest afterwards, leaving a half-loaded model."""
    shapes = [
        f"{k} {tuple(v.shape)} vs {tuple(current[k].shape)}"
        for k, v in state.items()
        if isinstance(v, torch.Tensor)
        and isinstance(current.get(k), torch.Tensor)
        and not nn.parameter.is_lazy(current[k])
        and v.shape != current[k].shape
    ]
    missing = [k for k in current if k not in state]
    unexpected = [k for k in state if k not in current]
    problems = [f"shapes differ (file vs model): {_few(shapes, 3)}"] if shapes else []
    if strict and missing:
        problems.append(f"missing {len(missing)}: {_few(missing)}")
    if strict and unexpected:
        problems.append(f"unexpected {len(unexpected)}: {_few(unexpected)}")
    if problems:
        hint = (
            "pass key=NAME for another object" if shapes else "pass strict=False to load the rest"
        )
        raise CheckpointError(
            f"the weights in {file} do not fit {name}: {'; '.join(problems)}; check that it is "
            f"the same architecture, or {hint}"
        )


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

    ``module.`` (DataParallel/DDP) and ``_orig_mod.`` (torch.compile) prefixes, nested or
    combined, are stripped only when that makes the keys match the model. On a mismatch nothing
    is copied. The report is logged at INFO.

    Args:
        path: a multigpu checkpoint directory / ``step-*`` directory / ``state.pt``, or a file
            holding a state dict, plain or nested under a usual key.
        key: which object or dict key holds the model, when several could.
        strict: every key must match (else missing/unexpected keys are reported).
        trust: allow a legacy pickle (``weights_only=False``), or a DCP index naming classes
            beyond the allow-list: only for files you trust.
        map_location: where tensors go (default CPU, so CUDA-saved files load anywhere).
    """
    target = unwrap_module(model)
    found, report = _read(path, key, trust, map_location)
    current = target.state_dict()
    if is_hub(report.path):  # the hub's own names, where transformers 5's modules differ
        found, names = renamed_state(target, found, set(current), report.path)
        report = replace(report, renamed=len(names.renamed), renamed_by=names.via)
    state, stripped = match_keys(found, set(current))  # renames keys, never drops one
    state = with_tied(state, tied_names(target))  # a tied name the file holds once (the hub)
    _check_fit(state, current, strict, report.path, type(target).__name__)
    casts = Counter(
        f"{str(v.dtype).removeprefix('torch.')} -> {str(current[k].dtype).removeprefix('torch.')}"
        for k, v in state.items()
        if isinstance(v, torch.Tensor)
        and isinstance(current.get(k), torch.Tensor)
        and v.dtype != current[k].dtype
    )
    try:
        result = target.load_state_dict(state, strict=strict)
    except RuntimeError as e:
        raise CheckpointError(
            f"the weights in {report.path} do not fit {type(target).__name__}: "
            f"{' '.join(str(e).split())}"
        ) from e
    report = replace(
        report,
        prefixes_stripped=stripped,
        missing_keys=tuple(result.missing_keys),
        unexpected_keys=tuple(result.unexpected_keys),
        dtype_casts=tuple(f"{pair} ({n} tensors)" for pair, n in sorted(casts.items())),
    )
    log.info("load_weights: %s", report)
    return report

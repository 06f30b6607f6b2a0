"""Reading one checkpoint file safely: ``weights_only`` first, full unpickling only when trusted.

``torch.load(..., weights_only=True)`` refuses two very different files with the same
exception: a real ``torch.save`` file that pickles custom classes (loadable with ``trust``) and
a file that is not a PyTorch file at all (which ``trust`` cannot fix, and should never be
advised for). The structure of the file tells them apart without running any of it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import pickletools
import re
import zipfile
from itertools import islice
from pathlib import Path
from typing import Any

import torch

from multigpu.checkpoint.hub import is_hub
from multigpu.checkpoint.layout import (
    MANIFEST_FILE,
    METADATA_FILE,
    STATE_FILE,
    find_latest,
    list_checkpoints,
    usable,
)
from multigpu.errors import CheckpointError, CheckpointUnreadableError, UsageError

_UNSAFE_GLOBAL = re.compile(r"GLOBAL (\S+) was not an allowed global")


def resolve(path: str | os.PathLike[str]) -> Path:
    """What to read for ``path``: a file as it is; a multigpu checkpoint (a root: its newest
    complete one) → its ``state.pt``; a plain DCP checkpoint (its directory or its
    ``.metadata``) or a directory of hub-format weights → that directory."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{p} does not exist; expected a checkpoint file or directory")
    if p.is_file():
        if p.name == METADATA_FILE:  # DCP's index stands for its checkpoint: the directory
            p = p.parent
        elif p.suffix == ".distcp":
            raise UsageError(
                f"{p} is one file of a sharded (DCP) checkpoint; pass its directory {p.parent}"
            )
        else:
            return p
    if (p / MANIFEST_FILE).exists() or (p / STATE_FILE).exists():
        return usable(p) / STATE_FILE
    if (p / METADATA_FILE).is_file() or is_hub(p):
        return p
    if list_checkpoints(p, checksums=False):
        latest = find_latest(p)
        if latest is None:
            raise CheckpointUnreadableError(
                f"{p} holds checkpoints but none is complete; see 'multigpu ckpt inspect {p}'"
            )
        return latest.path / STATE_FILE
    unfinished = unfinished_dcp(p)
    if unfinished is not None:
        raise unfinished
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


def is_dcp_directory(path: Path) -> bool:
    """Whether ``path`` is a DCP checkpoint directory that is not a multigpu checkpoint (one
    written by ``torch.distributed.checkpoint.save`` itself, e.g. by torchtitan)."""
    return (
        path.is_dir()
        and (path / METADATA_FILE).is_file()
        and not (path / MANIFEST_FILE).exists()
        and not (path / STATE_FILE).exists()
    )


def _written_by_torch_save(path: Path) -> bool:
    """Whether ``path`` has the structure of a ``torch.save`` file; reads, never unpickles."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                return any(n.rsplit("/", 1)[-1] == "data.pkl" for n in archive.namelist())
        # The pre-1.6 format (_use_new_zipfile_serialization=False) starts with a pickled magic
        # number; pickletools only disassembles, so a hostile file runs nothing here.
        with path.open("rb") as fh:
            for _op, arg, _pos in islice(pickletools.genops(fh), 4):
                if arg == torch.serialization.MAGIC_NUMBER:
                    return True
    except (OSError, ValueError, zipfile.BadZipFile):
        pass
    return False


def _unsafe_globals(path: Path, error: Exception) -> list[str]:
    """The classes/functions that made ``weights_only`` refuse ``path`` (may be empty)."""
    names = _UNSAFE_GLOBAL.findall(str(error))
    finder = getattr(torch.serialization, "get_unsafe_globals_in_checkpoint", None)  # torch 2.5+
    if finder is not None and zipfile.is_zipfile(path):
        # Only for a better message: the refusal stands whatever this finds.
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            names = sorted(set(names) | set(finder(path)))
    return names


def short_reason(error: BaseException) -> str:
    """The informative part of a load error (torch wraps weights_only errors in advice)."""
    text = str(error)
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1]
    first = " ".join(text.strip().split("\n", 1)[0].split())
    first = first.split(". ", 1)[0]  # torch appends advice that does not fit one line
    return f"{type(error).__name__}: {first[:160]}"


def _refusal(path: Path, error: Exception, trust: bool) -> CheckpointError:
    """The one-line error for a file ``torch.load`` could not read."""
    if not _written_by_torch_save(path):
        return CheckpointUnreadableError(
            f"{path} is not a readable PyTorch file ({short_reason(error)}); expected a complete "
            "file written by torch.save or a multigpu checkpoint directory"
        )
    if trust:
        return CheckpointError(
            f"{path} could not be unpickled even as trusted ({short_reason(error)}); a pickle "
            "needs every class it names importable: import them first, or re-save "
            "model.state_dict()"
        )
    if not isinstance(error, pickle.UnpicklingError):  # the weights_only unpickler's refusal
        return CheckpointUnreadableError(
            f"{path} is damaged ({short_reason(error)}); expected a complete file written by "
            "torch.save: save it again or take an older copy"
        )
    names = _unsafe_globals(path, error)
    holds = f"it holds {', '.join(names[:5])}" if names else f"({short_reason(error)})"
    return CheckpointError(
        f"{path} is a legacy pickle that weights_only loading refuses: {holds}; unpickling it "
        "can run arbitrary code, so only if you trust its source pass trust=True (CLI: --trust)"
    )


def load_file(
    path: Path, *, trust: bool = False, map_location: str | torch.device = "cpu"
) -> tuple[Any, dict[str, str]]:
    """``torch.load`` a file; return the object and ``{device recorded in file: device used}``.

    Every storage in a ``torch.save`` file carries the device it was saved from ("cuda:0");
    a ``map_location`` callable sees that string, which is how a CUDA-saved file is detected.
    """
    seen: dict[str, None] = {}  # the devices in the order the file holds them
    target = str(torch.device(map_location))
    placing: list[Exception] = []

    def restore(storage: Any, location: str) -> Any:
        seen[location] = None
        try:
            # What torch.load itself does for a string map_location.
            return torch.serialization.default_restore_location(storage, target)
        except Exception as e:
            placing.append(e)  # the file is fine; the target device is not there
            raise

    try:
        obj = torch.load(path, map_location=restore, weights_only=not trust)
    except Exception as e:
        if placing:
            raise CheckpointError(
                f"cannot put the tensors of {path} on {target} ({short_reason(placing[0])}); pass "
                "map_location='cpu' (the default) or a device this machine has"
            ) from e
        # A damaged or foreign file makes the unpickler raise nearly anything (KeyError,
        # IndexError, UnpicklingError, RuntimeError from the zip reader...): all mean the same.
        raise _refusal(path, e, trust) from e
    mapped = {location: target for location in seen if location != target}
    return obj, mapped

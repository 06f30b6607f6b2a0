"""Reading one checkpoint file safely: ``weights_only`` first, full unpickling only when trusted.

``torch.load(..., weights_only=True)`` refuses two very different files with the same
exception: a real ``torch.save`` file that pickles custom classes (loadable with ``trust``) and
a file that is not a PyTorch file at all (which ``trust`` cannot fix, and should never be
advised for). The structure of the file tells them apart without running any of it.
"""

from __future__ import annotations

import contextlib
import pickle
import pickletools
import re
import zipfile
from itertools import islice
from pathlib import Path
from typing import Any

import torch

from multigpu.errors import CheckpointError, CheckpointUnreadableError

_UNSAFE_GLOBAL = re.compile(r"GLOBAL (\S+) was not an allowed global")


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
    """``native.sharded.short_reason``, imported when a load fails (it imports DCP)."""
    from multigpu.checkpoint.native.sharded import short_reason as reason

    return reason(error)


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

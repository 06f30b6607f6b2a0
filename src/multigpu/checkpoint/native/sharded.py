"""The sharded part of a checkpoint: models and optimizers on ``torch.distributed.checkpoint``.

Every rank writes its own shards in parallel; loading reads whatever pieces this rank's current
shards need, so a checkpoint written by N processes under one strategy loads on M under another.

Safety: DCP reads its ``.metadata`` with plain ``pickle`` and non-tensor values with
``torch.load(weights_only=False)``; both would run any code a hostile file holds. Here the
metadata is read with an allow-list of the classes DCP writes (``torch_compat``), and every
non-tensor value must load with ``weights_only=True`` first.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import pickle
import warnings
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException, FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import (
    Metadata,
    StorageMeta,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import ReadItem, SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future as TorchFuture

from multigpu.checkpoint.native.layout import METADATA_FILE
from multigpu.checkpoint.native.space import DiskFullError, ran_out_of_space
from multigpu.common.worker_error import PEER_GONE_MARKERS
from multigpu.errors import CheckpointError, CheckpointMismatchError, CheckpointUnreadableError
from multigpu.runtime import dist
from multigpu.torch_compat import dcp_metadata_global_allowed


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if not dcp_metadata_global_allowed(module, name):
            raise pickle.UnpicklingError(
                f"{module}.{name} is not a class a DCP metadata file holds"
            )
        return super().find_class(module, name)


def short_reason(error: BaseException) -> str:
    """The informative part of a load error (torch wraps weights_only errors in advice)."""
    text = str(error)
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1]
    first = " ".join(text.strip().split("\n", 1)[0].split())
    first = first.split(". ", 1)[0]  # torch appends advice that does not fit one line
    return f"{type(error).__name__}: {first[:160]}"


def read_metadata(directory: str | os.PathLike[str], *, trust: bool = False) -> Metadata:
    """The DCP index of ``directory`` (its ``.metadata``), read with the allow-list."""
    path = Path(directory) / METADATA_FILE
    try:
        with path.open("rb") as fh:
            loaded = pickle.load(fh) if trust else _MetadataUnpickler(fh).load()
    except FileNotFoundError as e:
        raise CheckpointUnreadableError(
            f"{directory} has no {METADATA_FILE}: not a DCP checkpoint"
        ) from e
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ValueError) as e:
        raise CheckpointUnreadableError(f"cannot read {path}: {type(e).__name__}: {e}") from e
    if not isinstance(loaded, Metadata):
        raise CheckpointUnreadableError(f"{path} holds a {type(loaded).__name__}, not DCP metadata")
    return loaded


def file_problems(directory: Path, metadata: Metadata) -> tuple[dict[str, int], list[str]]:
    """{file: bytes} of a DCP checkpoint's files, and what is wrong with them: DCP has no
    checksums, but its index says where each piece ends, so a missing or truncated file shows."""
    ends: dict[str, int] = {}
    for where in (metadata.storage_data or {}).values():
        file = getattr(where, "relative_path", None)  # FileSystemWriter's _StorageInfo
        if isinstance(file, str):
            end = int(getattr(where, "offset", 0)) + int(getattr(where, "length", 0))
            ends[file] = max(ends.get(file, 0), end)
    files = {METADATA_FILE: (directory / METADATA_FILE).stat().st_size}
    problems = []
    for file, end in sorted(ends.items()):
        path = directory / file
        if not path.is_file():
            problems.append(f"{file}: missing (the index puts pieces in it)")
            continue
        files[file] = path.stat().st_size
        if files[file] < end:
            problems.append(f"{file}: {files[file]} bytes, the index reads up to {end} (truncated)")
    return files, problems


def read_complete(directory: str | os.PathLike[str], *, trust: bool = False) -> Metadata:
    """The index of the plain DCP checkpoint ``directory`` (``read_metadata``), once every file
    it names is there and long enough; else a CheckpointError naming them (one line)."""
    metadata = read_metadata(directory, trust=trust)
    _, problems = file_problems(Path(directory), metadata)
    if problems:
        more = f" (and {len(problems) - 2} more)" if len(problems) > 2 else ""
        raise CheckpointUnreadableError(
            f"the DCP checkpoint {directory} is incomplete: {'; '.join(problems[:2])}{more}; it "
            "was written or copied in part: copy it whole again, or take another checkpoint"
        )
    return metadata


class SafeReader(FileSystemReader):
    """``FileSystemReader`` whose metadata is read with the allow-list (see the module doc);
    ``trust=True`` lifts it, for an index naming other classes from a source you trust.
    ``metadata``: the index already read (a reader of one tensor at a time reads it once)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        trust: bool = False,
        metadata: Metadata | None = None,
    ) -> None:
        super().__init__(path)
        self.trust = trust
        self.metadata = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = self.metadata or read_metadata(self.path, trust=self.trust)
        storage = metadata.storage_meta or StorageMeta()
        storage.load_id = self.load_id  # as FileSystemReader does
        metadata.storage_meta = storage
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` that refuses non-tensor values ``weights_only`` cannot load."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            torch.load(value, weights_only=True)
        except Exception as e:
            raise CheckpointError(
                f"the value {read_item.dest_index.fqn!r} of the checkpoint is not plain data "
                f"({type(e).__name__}); refusing to unpickle it"
            ) from e
        value.seek(0)  # known safe now; torch's own reader loads it again
        super().load_bytes(read_item, value)


_NO_GROUP = "torch.distributed is disabled, unavailable or uninitialized"
# DCP's background thread (async_save) warns too, outside any catch_warnings of the caller's:
# one process with no group is what no_dist=True says, not something to warn about.
warnings.filterwarnings("ignore", message=_NO_GROUP)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Without torch's warning that one process means "no process group" (we said no_dist)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NO_GROUP)
        yield


class _Writer(FileSystemWriter):
    """``FileSystemWriter`` whose full disk is said as such: torch's writer reports ENOSPC as
    "unexpected pos" (the ``OSError`` only its context, lost when DCP sends the failure to the
    other ranks), so it is turned into a ``DiskFullError`` on the rank that met it."""

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> TorchFuture[list[WriteResult]]:
        with _disk_full_said(self.path):
            return super().write_data(plan, planner)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        with _disk_full_said(self.path):
            super().finish(metadata, results)


@contextlib.contextmanager
def _disk_full_said(directory: str | os.PathLike[str]) -> Iterator[None]:
    try:
        yield
    except Exception as e:
        if ran_out_of_space(e) and not isinstance(e, DiskFullError):
            raise DiskFullError(f"No space left on device writing to {directory}") from e
        raise


def save_sharded(state: Mapping[str, Any], directory: Path) -> None:
    """Write ``state`` (tensors, DTensors, plain values) to ``directory`` with DCP (collective)."""
    with _quiet(), one_line_failures():
        dcp.save(
            dict(state),
            storage_writer=_Writer(directory, sync_files=True),
            no_dist=not dist.is_initialized(),
        )


def save_sharded_async(state: Mapping[str, Any], directory: Path, group: Any) -> Future[Any]:
    """Copy ``state`` to CPU memory now and write it in DCP's background thread, over ``group``:
    a gloo group of its own, so that its collectives do not interleave with the training's."""
    with _quiet():
        return dcp.async_save(  # type: ignore[return-value]
            dict(state),
            storage_writer=_Writer(directory, sync_files=True),
            process_group=group,
            no_dist=not dist.is_initialized(),
        )


def written_by(directory: Path, rank: int) -> list[Path]:
    """The files of ``directory``'s DCP part that ``rank`` wrote (rank 0: also ``.metadata``)."""
    files = sorted(directory.glob(f"__{rank}_*.distcp"))
    if rank == 0 and (directory / METADATA_FILE).is_file():
        files.append(directory / METADATA_FILE)
    return files


def check_fits(
    metadata: Metadata, expected: Mapping[str, tuple[int, ...] | None], where: Path
) -> None:
    """Refuse to load when a wanted key is missing or its saved shape differs from the live one.

    ``expected`` maps flattened keys (``model.fc.weight``) to the live global shape (None: a
    non-tensor value). DCP's own errors would name one key in a multi-line traceback.
    """
    saved = metadata.state_dict_metadata
    missing = sorted(k for k in expected if k not in saved)
    sizes = {k: tuple(v.size) for k, v in saved.items() if isinstance(v, TensorStorageMetadata)}
    shapes = [
        f"{k} {sizes[k]} in the checkpoint vs {shape} here"
        for k, shape in expected.items()
        if k in sizes and shape is not None and sizes[k] != shape
    ]
    problems = []
    if shapes:
        more = f" (and {len(shapes) - 3} more)" if len(shapes) > 3 else ""
        problems.append("shapes differ: " + "; ".join(shapes[:3]) + more)
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        problems.append("missing: " + ", ".join(missing[:5]) + more)
    if problems:
        raise CheckpointMismatchError(
            f"checkpoint {where} does not fit this model: {'; '.join(problems)}; load it into "
            "the model (and optimizer) that saved it, built with the saved shapes (see "
            "'multigpu ckpt inspect'); for keys that are missing or renamed, convert the weights "
            "with 'multigpu ckpt convert' and load what matches with "
            "multigpu.load_weights(strict=False)"
        )


def load_sharded(
    targets: dict[str, Any],
    directory: Path,
    *,
    trust: bool = False,
    alone: bool = False,
    metadata: Metadata | None = None,
) -> None:
    """Fill ``targets`` (shaped like what was saved: tensors or this rank's DTensors) in place;
    ``alone``: in this process only, whatever process group there is; ``metadata``: the
    directory's index, when already read."""
    with _quiet(), one_line_failures(reading=directory):
        dcp.load(
            targets,
            storage_reader=SafeReader(directory, trust=trust, metadata=metadata),
            planner=SafeLoadPlanner(),
            no_dist=alone or not dist.is_initialized(),
        )


def load_with_reader(targets: dict[str, Any], reader: Any, planner: Any, *, where: Any) -> None:
    """Fill ``targets`` through DCP's planning with another ``StorageReader`` (collective when
    there is a process group): each rank reads the pieces its tensors hold (of ``where``)."""
    with _quiet(), one_line_failures(reading=where):
        dcp.load(
            targets,
            storage_reader=reader,
            planner=planner,
            no_dist=not dist.is_initialized(),
        )


@contextlib.contextmanager
def one_line_failures(reading: object = None) -> Iterator[None]:
    """DCP reports a failure as a CheckpointException holding every rank's error and its
    traceback; say the first one in one line (ours as it was raised). ``reading``: the
    checkpoint a load reads, whose file that cannot be read (a damaged piece DCP cannot
    unpickle, a truncated safetensors slice) is then said as such, on every rank alike
    (``CheckpointUnreadableError``)."""
    try:
        yield
    except CheckpointException as e:
        failures = [f[0] if isinstance(f, tuple) else f for f in e.failures.values()]
        ours = [f for f in failures if isinstance(f, CheckpointError)]
        if ours:
            raise ours[0] from e
        first = failures[0] if failures else e
        if reading is not None and _unreadable(first):
            raise CheckpointUnreadableError(
                f"cannot read {reading}: {short_reason(first)}; a file of it is damaged: copy it "
                "again, or take another checkpoint"
            ) from e
        raise CheckpointError(first_line(first)) from e


def _unreadable(error: BaseException) -> bool:
    """Whether ``error`` is a file's bytes that cannot be read (not a lost peer, not a bug)."""
    text = str(error)
    if any(marker in text for marker in PEER_GONE_MARKERS):
        return False
    return (
        isinstance(error, pickle.UnpicklingError | EOFError | OSError)
        or "PytorchStreamReader" in text
        or type(error).__name__ == "SafetensorError"
    )


def first_line(error: BaseException) -> str:
    """``error``'s type and the first line of its message, whitespace collapsed."""
    text = " ".join(str(error).strip().split("\n", 1)[0].split())
    return f"{type(error).__name__}: {text[:300]}"


def read_whole(
    directory: str | os.PathLike[str],
    names: set[str] | None = None,
    *,
    trust: bool = False,
    metadata: Metadata | None = None,
) -> dict[str, Any]:
    """The saved objects of a DCP checkpoint, whole, on the CPU, in one process (no model needed).

    ``names``: the top-level objects to read (default all). Each comes back as it was saved: a
    module's state dict, an optimizer's ``{"state", "param_groups"}``. ``trust``: read an index
    naming classes beyond the allow-list (non-tensor values must still load ``weights_only``);
    ``metadata``: the directory's index, when already read.
    """
    metadata = read_metadata(directory, trust=trust) if metadata is None else metadata
    paths: Mapping[str, Any] = metadata.planner_data or {}
    target: dict[str, Any] = {}
    for key, info in metadata.state_dict_metadata.items():
        path = tuple(paths.get(key, (key,)))
        if names is not None and str(path[0]) not in names:
            continue
        value: Any = None
        if isinstance(info, TensorStorageMetadata):
            value = torch.empty(tuple(info.size), dtype=info.properties.dtype)
        _place(target, path, value)
    load_sharded(target, Path(directory), trust=trust, alone=True, metadata=metadata)
    return target


def _place(root: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    """Put ``value`` at ``path`` in ``root``, making dicts (str keys) and lists (int keys)."""
    node: Any = root
    for part, after in itertools.pairwise(path):
        empty: Any = [] if isinstance(after, int) else {}
        if isinstance(node, list):
            node.extend(None for _ in range(part + 1 - len(node)))
            if node[part] is None:
                node[part] = empty
            node = node[part]
        else:
            node = node.setdefault(part, empty)
    last = path[-1]
    if isinstance(node, list):
        node.extend(None for _ in range(last + 1 - len(node)))
    node[last] = value

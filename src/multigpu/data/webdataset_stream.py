"""WebDataset pipelines (the ``webdataset`` package) as streams: what would give the ranks
different streams is refused in one line, as the loader is made or at its first pass.

A ``StreamLoader`` reads a stream whole on every rank and keeps each rank's part of the same
global batches, so every rank must read the same stream. A WebDataset pipeline is a list of
stages (``pipeline``), and three kinds break that:

- ``nodesplitter=wds.split_by_node``: each rank reads other shards;
- the default ``nodesplitter`` (``single_node_only``) raises at the first sample of a run of
  more than one process, so it is said before (give ``nodesplitter=None``);
- a shuffle stage without a seed (``.shuffle(n)``: a ``random.Random`` seeded from the process id
  and the clock), and a shard shuffle (``WebDataset(..., shardshuffle=n)``) whose seed each
  process drew itself (no ``seed=``, no ``WDS_SEED``): the seeds are compared across the ranks at
  the first pass (``check_seeds_agree``).

Its split among DataLoader workers (``split_by_worker``) is bypassed as an HF stream's is
(``multigpu.torch_compat.read_outside_worker``). Recognised by class (defined in the
``webdataset`` package), so ``webdataset`` is not imported here.
"""

from __future__ import annotations

from typing import Any

import torch

from multigpu.errors import UsageError

_FIX = (
    "multigpu deals every rank its part of the same global batches (RecordFiles(tar files) "
    "reads only each rank's share of tar shards)"
)


def is_webdataset(stream: Any) -> bool:
    """Whether ``stream`` is a pipeline of the ``webdataset`` package.

    Example:
        >>> is_webdataset(range(3))
        False
    """
    return any(cls.__module__.split(".")[0] == "webdataset" for cls in type(stream).__mro__)


def _shuffles(stream: Any) -> list[tuple[Any, dict[str, Any]]]:
    """The shuffle stages that shuffle: (buffer size, keyword arguments)."""
    found = []
    for stage in getattr(stream, "pipeline", None) or ():
        if getattr(getattr(stage, "f", None), "__name__", "") != "_shuffle":
            continue
        args, kw = getattr(stage, "args", ()), getattr(stage, "kw", {}) or {}
        size = args[0] if args else kw.get("bufsize", 1000)
        if size:
            found.append((size, kw))
    return found


def check(stream: Any) -> None:
    """Refuse a pipeline whose ranks would read different streams (see the module doc).

    Raises:
        UsageError: a node splitter, or a sample shuffle without a seed.
    """
    if not is_webdataset(stream):
        return
    dist = torch.distributed
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    for stage in getattr(stream, "pipeline", None) or ():
        name = getattr(stage, "__name__", "")
        if name == "split_by_node":
            raise UsageError(
                "WebDataset(nodesplitter=split_by_node) gives each rank other shards, so the "
                "ranks would train on different global batches; give nodesplitter=None: " + _FIX
            )
        if name == "single_node_only" and world > 1:
            raise UsageError(
                f"WebDataset's default nodesplitter (single_node_only) stops a run of {world} "
                "processes at its first sample; give WebDataset(..., nodesplitter=None): " + _FIX
            )
    for size, kw in _shuffles(stream):
        if kw.get("seed") is None and kw.get("rng") is None:
            raise UsageError(
                f"the WebDataset pipeline shuffles ({size}) without a seed, so each rank would "
                "read it in another order; give .shuffle(n, seed=0), or leave it out and let "
                "ctx.loader shuffle (shuffle=True, buffer_size=...)"
            )


def check_seeds_agree(stream: Any) -> None:
    """At a pass, in a run of more than one process: every rank's shuffle seeds must be the
    same (a ``WebDataset(shardshuffle=n)`` without ``seed=`` draws its own in each process).
    A collective: every rank makes the call.

    Raises:
        UsageError: the seeds differ between the ranks.
    """
    dist = torch.distributed
    if not (is_webdataset(stream) and dist.is_available() and dist.is_initialized()):
        return
    if dist.get_world_size() == 1:
        return
    mine = [kw.get("seed") for _, kw in _shuffles(stream)]
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if any(seeds != everyone[0] for seeds in everyone):
        raise UsageError(
            "the WebDataset pipeline shuffles its shards with a seed each process drew itself "
            f"(seeds {everyone[0]} on rank 0, {next(s for s in everyone if s != everyone[0])} "
            "on another), so each rank would read the shards in another order; give "
            "WebDataset(..., seed=0) (or set WDS_SEED), or shardshuffle=False"
        )

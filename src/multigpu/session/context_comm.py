"""Where a Context's process sits among the ranks, and how it talks to the others.

A mixin of ``Context`` (kept apart to keep each file to one concept): every method works at
world size 1 too, where a collective returns its input.
"""

from __future__ import annotations

import builtins
import contextlib
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import torch

from multigpu.common import worker_error
from multigpu.env.types import ClusterEnv
from multigpu.errors import UsageError
from multigpu.runtime import dist

if TYPE_CHECKING:
    from multigpu.instruments.hooks import Hook
    from multigpu.strategies import Strategy

T = TypeVar("T")


class RankTools:
    """Rank facts, collectives and output for the ranks of a job (mixed into ``Context``)."""

    env: ClusterEnv
    backend: str | None
    device: torch.device
    strategy: Strategy
    _hooks: tuple[Hook, ...]

    @property
    def rank(self) -> int:
        """Global rank of this process."""
        return self.env.rank

    @property
    def local_rank(self) -> int:
        """Rank of this process on its node (its GPU index when on CUDA)."""
        return self.env.local_rank

    @property
    def world_size(self) -> int:
        """Number of processes in the job."""
        return self.env.world_size

    @property
    def local_world_size(self) -> int:
        """Number of processes on this node."""
        return self.env.local_world_size

    @property
    def node_rank(self) -> int:
        """Index of this node."""
        return self.env.node_rank

    @property
    def num_nodes(self) -> int:
        """Number of nodes in the job."""
        return self.env.num_nodes

    @property
    def repeats_data(self) -> bool:
        """Whether this rank reads the same data as a lower rank (a tensor-parallel group, a
        pipeline's processes: ``Strategy.data_shard``); its metrics' states then stay out of
        ``compute()``'s sums, so that each sample counts once."""
        shard_of = self.strategy.data_shard
        mine = shard_of(self.rank, self.world_size)[0]
        return any(shard_of(r, self.world_size)[0] == mine for r in range(self.rank))

    @property
    def is_main(self) -> bool:
        """True on global rank 0 (the one that prints and writes files). Under replica groups
        (``multigpu run --replicas``) on one process of the whole job: rank 0 of the group that
        writes (see docs/fault-tolerance.md)."""
        return self.env.rank == 0 and all(hook.writes_outputs(self) for hook in self._hooks)

    @property
    def is_distributed(self) -> bool:
        """True when more than one process takes part."""
        return self.env.world_size > 1

    def barrier(self) -> None:
        """Wait until every rank arrives (bounded by the timeout)."""
        dist.barrier()

    def all_reduce(self, value: T, op: dist.ReduceOp = "mean") -> T:
        """Reduce a tensor or number over ranks: ``mean``, ``sum``, ``max``, ``min``, ``prod``."""
        return dist.all_reduce(value, op=op, device=self._comm_device())

    def reduce(self, value: Any, op: str = "sum") -> NoReturn:
        """Removed (it was an all-reduce, unlike torch's ``reduce`` to one rank): use
        ``ctx.all_reduce(value, op="sum")``. Raises UsageError saying so, for one release."""
        raise UsageError(
            f"ctx.reduce(value, op={op!r}) was renamed: it is an all-reduce (every rank gets the "
            f"result), unlike torch.distributed.reduce; use ctx.all_reduce(value, op={op!r})"
        )

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order, on every rank (tensors may differ in length)."""
        return dist.gather(value, device=self._comm_device())

    def broadcast(self, value: T, src: int = 0) -> T:
        """Rank ``src``'s ``value`` on every rank."""
        return dist.broadcast(value, src=src)

    def _comm_device(self) -> torch.device:
        return self.device if self.backend == "nccl" else torch.device("cpu")

    def print(self, *args: Any, all_ranks: bool = False, **kwargs: Any) -> None:
        """``print`` on rank 0 only (``all_ranks=True``: every rank, prefixed with its rank).

        The line is written in one call and flushed, so lines of different ranks never
        interleave mid-line.
        """
        if not (all_ranks or self.is_main):
            return
        sep, end = kwargs.pop("sep", None), kwargs.pop("end", None)
        text = (" " if sep is None else sep).join(str(a) for a in args)
        if all_ranks and self.is_distributed:
            text = f"[rank{self.rank}] {text}"
        # Text and end in one write: print() writes them apart, and with unbuffered output (the
        # launcher's PYTHONUNBUFFERED) another rank's line landed between them ("[rank0] a[rank1]
        # a"). file=None, end=None: print's defaults.
        builtins.print(text + ("\n" if end is None else end), end="", flush=True, **kwargs)

    @contextlib.contextmanager
    def rank_zero_first(self) -> Iterator[None]:
        """Let rank 0 run the block first (e.g. a download), then the others."""
        if not self.is_main:
            self.barrier()
        yield
        if self.is_main:
            self.barrier()


def report_failure(error: BaseException | None, env: ClusterEnv) -> bool:
    """Record ``error`` for the launcher's one-line summary (``multigpu.common.worker_error``); True
    when recorded. A usage error then ends a torchrun worker: one line on stderr, exit code 2
    (what the launcher reports as the user's error, not a crash).

    ``multigpu run`` prints the line itself (read from the worker's error file), so the worker
    stays silent. Under plain torchrun the worker says it: every rank usually refuses the same
    input, so a rank other than 0 waits a moment, in which the agent stops it once rank 0 has
    exited, and the message appears once; if rank 0 did not refuse, it still appears, from the
    rank that did.
    """
    recorded = worker_error.record(error)
    if not isinstance(error, UsageError) or env.source != "torchrun":
        return recorded
    if not (recorded and worker_error.launched_by_multigpu()):
        if env.rank != 0:
            time.sleep(1.0)
        prefix = f"rank {env.rank}: " if env.rank else ""
        print(f"multigpu: error: {prefix}{error}", file=sys.stderr, flush=True)
    raise SystemExit(2) from error

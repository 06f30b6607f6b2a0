"""What a Context offers for talking between ranks: collectives, rank-0 printing, ordering.

A mixin of ``Context`` (kept apart to keep each file to one concept): every method works at
world size 1 too, where a collective returns its input.
"""

from __future__ import annotations

import builtins
import contextlib
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from multigpu import dist

T = TypeVar("T")


class RankTools:
    """Collectives and output for the ranks of a job (mixed into ``Context``)."""

    backend: str | None
    device: torch.device
    if TYPE_CHECKING:  # defined by Context

        @property
        def rank(self) -> int: ...

        @property
        def is_main(self) -> bool: ...

        @property
        def is_distributed(self) -> bool: ...

    def barrier(self) -> None:
        """Wait until every rank arrives (bounded by the timeout)."""
        dist.barrier()

    def all_reduce(self, value: T, op: dist.ReduceOp = "mean") -> T:
        """Reduce a tensor or number over ranks: ``mean``, ``sum``, ``max``, ``min``, ``prod``."""
        return dist.all_reduce(value, op=op, device=self._comm_device())

    def reduce(self, value: T, op: dist.ReduceOp = "sum") -> T:
        """Like ``all_reduce`` with ``sum`` by default: totals of counts and sums over ranks."""
        return dist.all_reduce(value, op=op, device=self._comm_device())

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
        sep = kwargs.pop("sep", " ")
        end = kwargs.pop("end", "\n")
        file = kwargs.pop("file", None) or sys.stdout
        text = sep.join(str(a) for a in args)
        if all_ranks and self.is_distributed:
            text = f"[rank{self.rank}] {text}"
        builtins.print(text, end=end, file=file, flush=True, **kwargs)

    @contextlib.contextmanager
    def rank_zero_first(self) -> Iterator[None]:
        """Let rank 0 run the block first (e.g. a download), then the others."""
        if not self.is_main:
            self.barrier()
        yield
        if self.is_main:
            self.barrier()

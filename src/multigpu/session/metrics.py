"""Exact evaluation metrics across ranks: local sums and counts, one all-reduce in ``compute()``.

``update()`` never communicates, so ranks with different numbers of evaluation batches (the
``shuffle=False`` loader splits the last batch unevenly, never pads) cannot hang in the loop.
``compute()`` is the one collective (every rank must call it): it sums each rank's float64
``[total, count]`` (integers exact up to 2**53), so each sample counts once, at any world size.
A rank whose data repeats a lower rank's (a tensor-parallel group or a pipeline reads one batch
on each of its ranks) adds nothing: the live Context says whether this rank does (``enter``).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from typing import Any, Protocol

import torch

from multigpu.errors import UsageError
from multigpu.runtime import dist


def _comm_device() -> torch.device:
    # nccl reduces CUDA tensors only; gloo (and no group at all) works on CPU tensors.
    if dist.is_initialized() and torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class DataShare(Protocol):
    """What a metric asks the Context it is computed in (``Context.repeats_data``)."""

    @property
    def repeats_data(self) -> bool:
        """Whether this rank's data repeats a lower rank's (``Strategy.data_shard``)."""
        ...


_LIVE: list[weakref.ref[DataShare]] = []
"""The Contexts alive in this process (``enter`` to ``leave``: ``multigpu.init`` to teardown),
the innermost last; ``compute()`` asks the innermost, so what a rank's data is belongs to its
Context (its strategy), not to whichever loader was made last."""


def enter(context: DataShare) -> None:
    """A Context begins: metrics computed from now on ask it (until ``leave``)."""
    _LIVE.append(weakref.ref(context))


def leave(context: DataShare) -> None:
    """A Context ends (its teardown): metrics no longer ask it."""
    _LIVE[:] = [ref for ref in _LIVE if ref() not in (None, context)]


def _repeats_data() -> bool:
    live = [ctx for ctx in (ref() for ref in _LIVE) if ctx is not None]
    return bool(live) and live[-1].repeats_data


class Metric:
    """Base: a float64 state ``[total, count]``; ``compute()`` sums it over ranks.

    ``compute()`` returns ``total / count`` unless a subclass overrides ``_value``.
    """

    def __init__(self) -> None:
        self._local = torch.zeros(2, dtype=torch.float64)
        self._global: torch.Tensor | None = None

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Add a batch to this rank's state (no communication)."""
        raise NotImplementedError

    def _add(self, delta: torch.Tensor) -> None:
        if self._local.device != delta.device:
            # State lives where the batches do: no host sync per update.
            self._local = self._local.to(delta.device)
        self._local += delta.to(self._local.device, torch.float64)
        self._global = None

    def _value(self, state: torch.Tensor) -> float:
        if state[1].item() == 0:
            return math.nan  # nothing seen on any rank: no ratio exists
        return float((state[0] / state[1]).item())

    def compute(self) -> float | torch.Tensor:
        """Reduce over every rank (collective: call it on all ranks) and return the value."""
        local = torch.zeros_like(self._local) if _repeats_data() else self._local
        reduced = dist.all_reduce(local.to(_comm_device()), op="sum")
        self._global = reduced.cpu()
        return self._value(self._global)

    def reset(self) -> None:
        """Forget every update (e.g. before the next evaluation)."""
        self._local = torch.zeros(2, dtype=torch.float64, device=self._local.device)
        self._global = None

    @property
    def count(self) -> float:
        """Samples seen: this rank's, or every rank's after ``compute()`` (until an update)."""
        state = self._global if self._global is not None else self._local
        return float(state[-1].item())

    def state_dict(self) -> dict[str, Any]:
        """This rank's local state as plain floats (loadable with ``weights_only=True``).

        The global value depends only on the sum of the ranks' states: to resume on another
        world size, load the sum on one rank and ``reset()`` the others.

        Example:
            >>> s = Sum(); s.update(3.0); s.state_dict()
            {'metric': 'Sum', 'state': [3.0, 1.0]}
        """
        return {"metric": type(self).__name__, "state": self._local.cpu().tolist()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a ``state_dict()`` of the same metric class."""
        name = type(self).__name__
        ok = isinstance(state, Mapping) and state.get("metric") == name
        values = state.get("state") if ok else None
        if not isinstance(values, list | tuple) or len(values) != 2:
            raise UsageError(
                f"load_state_dict got {state!r:.200}; expected the dict returned by "
                f"{name}().state_dict(); load each metric's own state"
            )
        self._local = torch.tensor([float(v) for v in values], dtype=torch.float64)
        self._global = None


def _as_tensor(value: torch.Tensor | float | int, name: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(f"{name} is a {type(value).__name__}; expected a tensor or a number")
    return torch.tensor(float(value), dtype=torch.float64)


class Mean(Metric):
    """Weighted mean of values over every rank; ``count`` is the total weight.

    Example:
        >>> m = Mean()
        >>> m.update(torch.tensor([0.5, 1.5]))   # per-sample losses: 2 samples
        >>> m.update(2.0, weight=2)              # a batch mean over 2 samples
        >>> m.compute(), m.count
        (1.5, 4.0)
    """

    def update(self, value: torch.Tensor | float, weight: torch.Tensor | float | int = 1) -> None:
        """Add ``value`` (every element a sample) with ``weight`` broadcast to its shape."""
        v = _as_tensor(value, "value").to(torch.float64)
        w = _as_tensor(weight, "weight").to(v.device, torch.float64)
        try:
            w = w.expand_as(v)
        except RuntimeError as e:
            raise UsageError(
                f"weight of shape {tuple(w.shape)} does not broadcast to value of shape "
                f"{tuple(v.shape)}; give a number or a tensor of the value's shape"
            ) from e
        # Weight 0 leaves no trace, even of a NaN value (the mean loss of an empty batch).
        weighted = torch.where(w != 0, v * w, torch.zeros_like(v))
        self._add(torch.stack([weighted.sum(), w.sum()]))


class Sum(Metric):
    """Sum of every element of every value over every rank; ``count`` counts the elements.

    Example:
        >>> s = Sum(); s.update(torch.tensor([1.0, 2.0])); s.update(4)
        >>> s.compute(), s.count
        (7.0, 3.0)
    """

    def update(self, value: torch.Tensor | float) -> None:
        """Add every element of ``value``."""
        v = _as_tensor(value, "value").to(torch.float64)
        self._add(torch.stack([v.sum(), torch.tensor(float(v.numel()), device=v.device)]))

    def _value(self, state: torch.Tensor) -> float:
        return float(state[0].item())


class Accuracy(Metric):
    """Fraction of samples whose target is among the ``top_k`` highest scores.

    ``update(logits, target)``: logits ``[N, C, ...]`` with target ``[N, ...]`` (class dim 1,
    as for ``cross_entropy``), or predicted classes of the target's shape (``top_k=1`` only).

    Example:
        >>> acc = Accuracy()
        >>> acc.update(torch.tensor([[0.1, 0.9], [0.8, 0.2]]), torch.tensor([1, 1]))
        >>> acc.compute(), acc.count
        (0.5, 2.0)
    """

    def __init__(self, top_k: int = 1) -> None:
        super().__init__()
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise UsageError(f"top_k={top_k!r}; expected an integer >= 1, e.g. top_k=5")
        self.top_k = top_k

    def update(self, logits_or_preds: torch.Tensor, target: torch.Tensor) -> None:
        """Count the correct samples of a batch."""
        scores, target = logits_or_preds.detach(), target.detach()
        class_dim_ok = scores.dim() == target.dim() + 1 and scores.shape[1] >= self.top_k
        if scores.shape == target.shape and self.top_k == 1:
            correct = scores.eq(target)
        elif class_dim_ok and scores.shape[:1] + scores.shape[2:] == target.shape:
            top = scores.topk(self.top_k, dim=1).indices
            correct = top.eq(target.unsqueeze(1)).any(dim=1)
        else:
            raise UsageError(
                f"Accuracy(top_k={self.top_k}) got scores of shape {tuple(scores.shape)} and "
                f"target of shape {tuple(target.shape)}; expected logits [N, C, ...] with "
                "C >= top_k and target [N, ...], or (top_k=1) predictions of the target's shape"
            )
        counts = torch.stack([correct.sum(), torch.tensor(correct.numel(), device=correct.device)])
        self._add(counts)


def gather_all(value: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's ``value`` along dim 0, in RANK order (collective).

    First dims may differ between ranks (an empty tensor is fine; dtype and trailing shape
    must match); nothing padded is returned. The order is rank-major — all of rank 0's rows,
    then rank 1's — which is NOT dataset order for a sharded loader, whose global batches are
    split into rank slices; use ``gather_in_dataset_order`` when the order matters.

    Example:
        >>> gather_all(torch.tensor([1, 2]))       # world size 1: the tensor itself
        tensor([1, 2])
    """
    if not isinstance(value, torch.Tensor):
        raise UsageError(f"gather_all got a {type(value).__name__}; expected a tensor")
    parts = dist.gather(value.detach().to(_comm_device()), device=_comm_device())
    return torch.cat([p.reshape(1) if p.dim() == 0 else p for p in parts]).to(value.device)


def gather_in_dataset_order(values: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Gather every rank's ``values`` and sort the rows by their dataset ``indices`` (collective).

    ``indices[i]`` is the dataset index of ``values[i]`` on this rank — e.g. yielded by the
    dataset, or for a ``shuffle=False`` loader ``torch.tensor([i for b in loader.sampler for i
    in b])`` taken before the pass. Duplicated indices are an error: padding would count twice.

    Example:
        >>> gather_in_dataset_order(torch.tensor([7.0, 5.0]), torch.tensor([1, 0]))
        tensor([5., 7.])
    """
    # Checked before communicating; a rank that raises here leaves the others to time out.
    rows = values.shape[0] if isinstance(values, torch.Tensor) and values.dim() else -1
    integer = isinstance(indices, torch.Tensor) and not indices.is_floating_point()
    if not integer or indices.shape != (rows,):
        raise UsageError(
            f"gather_in_dataset_order got values {getattr(values, 'shape', type(values))} and "
            f"indices {getattr(indices, 'shape', type(indices))}; expected N rows and a 1-D "
            "integer tensor of their N dataset indices"
        )
    every_value, every_index = gather_all(values), gather_all(indices.to(torch.int64))
    order = torch.argsort(every_index.cpu(), stable=True)
    sorted_index = every_index.cpu()[order]
    repeats = int((sorted_index[1:] == sorted_index[:-1]).sum().item())
    if repeats:
        raise UsageError(
            f"gather_in_dataset_order saw {repeats} dataset indices more than once; a padded "
            "sampler (DistributedSampler) repeats samples: use ctx.loader(..., shuffle=False)"
        )
    return every_value[order.to(every_value.device)]


__all__ = ["Accuracy", "Mean", "Metric", "Sum", "gather_all", "gather_in_dataset_order"]

"""The pure comparison behind ``multigpu verify``: parameters, step counts and losses.

Differences are relative to the size of the whole tensor, not element by element:
``max|a - b| / (max|b| + 1e-12)``. An element-wise ``|a - b| / |b|`` explodes wherever the
reference is near zero, which says nothing about whether training went the same way.
A tensor (or a loss) is within tolerance when ``max|a - b| <= atol + rtol * max|b|``.

Adaptive optimizers (Adam, AdamW, RMSprop...) amplify rounding: a gradient that nearly cancels
can change sign between world sizes and move its weight a full step the other way. So with one
and no ``--rtol`` given, a tensor is judged by its relative L2 difference ``||a - b|| / ||b||``
against ``l2_rtol``, and the worst single element is reported beside it (the measurements:
docs/same-results.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from multigpu.diagnostics.records import RunRecord, run_label

TINY = 1e-12
"""Added to the reference's scale so that an all-zero tensor does not divide by zero."""

# float32: one sum of a batch's gradients (one process) and per-rank sums averaged by the
# all-reduce round differently (~1e-7), which Adam amplifies (2.8e-5 on the digits job).
DEFAULT_RTOL = {"float64": 1e-10, "float32": 1e-4, "bfloat16": 1e-2, "float16": 1e-2}
MIXED_PRECISION_RTOL = 1e-2
ADAPTIVE_L2_RTOL = 1e-2
"""Relative L2 tolerance of tensors trained by an adaptive optimizer (see the module doc)."""


def default_rtol(dtype: str | None, precision: str | None) -> float:
    """The default relative tolerance for a run's dtype and precision.

    Example:
        >>> default_rtol("float32", "32"), default_rtol("float32", "bf16-mixed")
        (0.0001, 0.01)
    """
    if precision not in (None, "32"):
        return MIXED_PRECISION_RTOL
    return DEFAULT_RTOL.get(dtype or "float32", DEFAULT_RTOL["float32"])


@dataclass(frozen=True, kw_only=True)
class Tolerance:
    """How far apart two results may be: ``diff <= atol + rtol * scale``."""

    rtol: float
    """Relative to the reference's largest absolute value (per tensor, or the loss)."""
    atol: float = 0.0
    l2_rtol: float | None = None
    """When set (adaptive optimizers), tensors are judged by ``||a-b|| / ||b|| <= l2_rtol``."""

    def allows(self, diff: float, scale: float) -> bool:
        """True when ``diff`` is within tolerance of a reference of size ``scale`` (NaN: no)."""
        return diff <= self.atol + self.rtol * scale


@dataclass(frozen=True, kw_only=True)
class TensorDiff:
    """One parameter or buffer compared with the reference run's."""

    name: str
    """The ``state_dict`` key."""
    shape: tuple[int, ...]
    max_abs: float
    """``max|a - b|`` (NaN when only one side is NaN, inf when missing or reshaped)."""
    max_rel: float
    """``max|a - b| / (max|b| + 1e-12)``."""
    l2_rel: float = 0.0
    """``||a - b|| / (||b|| + 1e-12)`` over the whole tensor."""
    ok: bool
    problem: str = ""
    """Why it could not be compared (missing, different shape), else empty."""


@dataclass(frozen=True, kw_only=True)
class LossDiff:
    """The per-step global losses of a run compared with the reference's."""

    compared: int
    """Steps where both runs recorded a loss."""
    max_abs: float
    max_rel: float
    first_step: int | None
    """The first (1-based) step whose loss differs beyond tolerance; None if none does."""
    first_values: tuple[float, float] | None
    """(this run's loss, the reference's loss) at ``first_step``."""

    @property
    def ok(self) -> bool:
        return self.first_step is None


@dataclass(frozen=True, kw_only=True)
class RunComparison:
    """A run at one world size against the reference run (the first world size)."""

    world_size: int
    reference_world_size: int
    tensors: tuple[TensorDiff, ...]
    losses: LossDiff
    steps: int
    reference_steps: int
    accumulation: int | None = None
    """This run's accumulation steps when verify varies them (``--accumulation``), else None."""
    reference_accumulation: int | None = None

    @property
    def label(self) -> str:
        """``world size N`` (``, accumulation K``): this run."""
        return run_label(self.world_size, self.accumulation)

    @property
    def reference_label(self) -> str:
        return run_label(self.reference_world_size, self.reference_accumulation)

    @property
    def tensors_ok(self) -> bool:
        return all(t.ok for t in self.tensors)

    @property
    def ok(self) -> bool:
        """Every tensor and loss within tolerance and the same number of optimizer steps."""
        return self.tensors_ok and self.losses.ok and self.steps == self.reference_steps

    @property
    def max_abs(self) -> float:
        return max((t.max_abs for t in self.tensors), default=0.0)

    @property
    def max_rel(self) -> float:
        return max((t.max_rel for t in self.tensors), default=0.0)

    @property
    def l2_rel(self) -> float:
        return max((t.l2_rel for t in self.tensors), default=0.0)


def tensor_diff(
    name: str, value: torch.Tensor, reference: torch.Tensor, tol: Tolerance
) -> TensorDiff:
    """Compare one tensor with the reference's (computed in float64).

    Example:
        >>> d = tensor_diff("w", torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.001]),
        ...                 Tolerance(rtol=1e-3))
        >>> d.ok, round(d.max_rel, 6)
        (True, 0.0005)
    """
    shape = tuple(reference.shape)
    if tuple(value.shape) != shape:
        return _uncomparable(name, shape, f"shape {tuple(value.shape)} instead of {shape}")
    if reference.numel() == 0:
        return TensorDiff(name=name, shape=shape, max_abs=0.0, max_rel=0.0, ok=True)
    a = value.detach().to(torch.float64)
    b = reference.detach().to(torch.float64)
    # Equal values (infinities and NaNs in the same places too) differ by 0, not by NaN.
    same = (a == b) | (a.isnan() & b.isnan())
    diff = torch.where(same, torch.zeros_like(a), (a - b).abs())
    max_abs = float(diff.max())
    scale = float(b.abs().nan_to_num(nan=0.0).max())
    max_rel = max_abs / (scale + TINY)
    l2_rel = float(diff.norm()) / (float(b.nan_to_num(nan=0.0).norm()) + TINY)
    ok = tol.allows(max_abs, scale) if tol.l2_rtol is None else l2_rel <= tol.l2_rtol
    return TensorDiff(
        name=name, shape=shape, max_abs=max_abs, max_rel=max_rel, l2_rel=l2_rel, ok=ok
    )


def compare_params(
    params: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor], tol: Tolerance
) -> list[TensorDiff]:
    """Every tensor of ``reference`` (then any extra one of ``params``), in state-dict order."""
    out: list[TensorDiff] = []
    for name, ref in reference.items():
        if name not in params:
            out.append(_uncomparable(name, tuple(ref.shape), "missing in this run"))
        else:
            out.append(tensor_diff(name, params[name], ref, tol))
    for name, value in params.items():
        if name not in reference:
            out.append(_uncomparable(name, tuple(value.shape), "missing in the reference run"))
    return out


def _uncomparable(name: str, shape: tuple[int, ...], problem: str) -> TensorDiff:
    return TensorDiff(
        name=name, shape=shape, max_abs=math.inf, max_rel=math.inf, ok=False, problem=problem
    )


def compare_losses(
    losses: Sequence[float | None], reference: Sequence[float | None], tol: Tolerance
) -> LossDiff:
    """Compare per-step losses where both runs have one; find the first beyond tolerance.

    Example:
        >>> d = compare_losses([2.0, 1.5, 1.2], [2.0, 1.5, 1.0], Tolerance(rtol=1e-5))
        >>> d.first_step, d.first_values
        (3, (1.2, 1.0))
    """
    compared = 0
    max_abs = max_rel = 0.0
    first_step: int | None = None
    first_values: tuple[float, float] | None = None
    for step, (a, b) in enumerate(zip(losses, reference, strict=False), start=1):
        if a is None or b is None:
            continue
        compared += 1
        diff = 0.0 if a == b or (math.isnan(a) and math.isnan(b)) else abs(a - b)
        if math.isnan(diff):  # only one of them is NaN: as different as can be
            diff = math.inf
        scale = 0.0 if math.isnan(b) else abs(b)
        max_abs = max(max_abs, diff)
        max_rel = max(max_rel, diff / (scale + TINY))
        if first_step is None and not tol.allows(diff, scale):
            first_step, first_values = step, (a, b)
    return LossDiff(
        compared=compared,
        max_abs=max_abs,
        max_rel=max_rel,
        first_step=first_step,
        first_values=first_values,
    )


def compare_runs(run: RunRecord, reference: RunRecord, tol: Tolerance) -> RunComparison:
    """Compare a run with the reference run: tensors, losses and step counts."""
    return RunComparison(
        world_size=run.world_size,
        reference_world_size=reference.world_size,
        tensors=tuple(compare_params(run.params, reference.params, tol)),
        losses=compare_losses(run.losses, reference.losses, tol),
        steps=run.steps,
        reference_steps=reference.steps,
        accumulation=run.accumulation,
        reference_accumulation=reference.accumulation,
    )

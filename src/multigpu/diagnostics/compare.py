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

A tensor whose gradient stayed at rounding level is not judged by its difference at all: an
attention key's bias gets a gradient that is zero but for rounding (softmax ignores a constant
added to every score), so its values are rounding noise, driven one way at one world size and
another way at the next, and ``max|a - b| / max|b|`` comes out near 1 in runs that agree
everywhere else. The workers record, per parameter, the largest ratio over the optimizer steps
of its gradient's root mean square to that of the gradients of the module that holds it (its
own parameters: a bias beside its weight); a tensor whose ratio stayed at or below the square
root of the machine epsilon of the dtype the gradients are computed in (``noise_floor``:
float32 3.5e-4, half its digits) in both runs is *judged at noise level*: within tolerance
whatever its difference, and named as such. Measured (tiny OPT, DistilBERT, BART, Marian, 8
steps of SGD or AdamW under FSDP at 1 and 2 processes): key biases 1.9e-7 to 4.5e-6, every
other bias 1.03 or more.
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

_COMPUTE_DTYPE = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
"""The dtype a mixed-precision run computes its gradients in."""


def gradient_dtype(dtype: str | None, precision: str | None) -> str:
    """The dtype a run computes its gradients in: the parameters', or mixed precision's.

    Example:
        >>> gradient_dtype("float64", "32"), gradient_dtype("float32", "bf16-mixed")
        ('float64', 'bfloat16')
    """
    computed = _COMPUTE_DTYPE.get(precision or "32")
    if computed is None:
        computed = getattr(torch, dtype or "float32", torch.float32)
        if not isinstance(computed, torch.dtype) or not computed.is_floating_point:
            computed = torch.float32
    return str(computed).removeprefix("torch.")


def noise_floor(dtype: str | None, precision: str | None) -> float:
    """The ratio of gradient sizes at or below which a tensor's gradient is rounding noise of
    its module's: the square root of the machine epsilon of the dtype the gradients are computed
    in (see the module doc).

    Example:
        >>> round(noise_floor("float32", "32"), 6), noise_floor("float32", "bf16-mixed")
        (0.000345, 0.08838834764831845)
    """
    return math.sqrt(torch.finfo(getattr(torch, gradient_dtype(dtype, precision))).eps)


def at_noise_level(run: RunRecord, reference: RunRecord) -> frozenset[str]:
    """The parameters whose gradient stayed at rounding level in both runs (see the module doc).

    Example:
        >>> ranks = [{"dtype": "float32", "gradient_noise": {"k.bias": 2e-7, "k.weight": 1.0}}]
        >>> sorted(at_noise_level(RunRecord(world_size=1, ranks=ranks),
        ...                       RunRecord(world_size=1, ranks=ranks)))
        ['k.bias']
    """
    floor = noise_floor(reference.dtype, reference.precision)
    mine, theirs = run.gradient_noise, reference.gradient_noise
    return frozenset(
        name for name, ratio in theirs.items() if name in mine and max(ratio, mine[name]) <= floor
    )


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
    noise: bool = False
    """Judged at noise level: beyond tolerance, but its gradient stayed at rounding level in
    both runs, so its difference is rounding noise and ``ok`` is True (see the module doc)."""


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
    def noise_level(self) -> tuple[str, ...]:
        """The tensors judged at noise level (beyond tolerance, their gradient rounding noise)."""
        return tuple(t.name for t in self.tensors if t.noise)

    @property
    def max_abs(self) -> float:
        """The largest of the judged tensors (those at noise level left out)."""
        return max((t.max_abs for t in self.tensors if not t.noise), default=0.0)

    @property
    def max_rel(self) -> float:
        return max((t.max_rel for t in self.tensors if not t.noise), default=0.0)

    @property
    def l2_rel(self) -> float:
        return max((t.l2_rel for t in self.tensors if not t.noise), default=0.0)


def tensor_diff(
    name: str,
    value: torch.Tensor,
    reference: torch.Tensor,
    tol: Tolerance,
    *,
    noise: bool = False,
) -> TensorDiff:
    """Compare one tensor with the reference's (computed in float64); ``noise``: its gradient
    stayed at rounding level in both runs, so a difference beyond tolerance is judged at noise
    level (within tolerance, ``noise`` set) unless it is not finite.

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
    noise = noise and not ok and math.isfinite(max_abs)
    return TensorDiff(
        name=name,
        shape=shape,
        max_abs=max_abs,
        max_rel=max_rel,
        l2_rel=l2_rel,
        ok=ok or noise,
        noise=noise,
    )


def compare_params(
    params: Mapping[str, torch.Tensor],
    reference: Mapping[str, torch.Tensor],
    tol: Tolerance,
    noise: frozenset[str] = frozenset(),
) -> list[TensorDiff]:
    """Every tensor of ``reference`` (then any extra one of ``params``), in state-dict order;
    those named in ``noise`` are judged at noise level where beyond tolerance."""
    out: list[TensorDiff] = []
    for name, ref in reference.items():
        if name not in params:
            out.append(_uncomparable(name, tuple(ref.shape), "missing in this run"))
        else:
            out.append(tensor_diff(name, params[name], ref, tol, noise=name in noise))
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
    """Compare a run with the reference run: tensors (those whose gradient stayed at rounding
    level in both judged at noise level), losses and step counts."""
    return RunComparison(
        world_size=run.world_size,
        reference_world_size=reference.world_size,
        tensors=tuple(
            compare_params(run.params, reference.params, tol, at_noise_level(run, reference))
        ),
        losses=compare_losses(run.losses, reference.losses, tol),
        steps=run.steps,
        reference_steps=reference.steps,
        accumulation=run.accumulation,
        reference_accumulation=reference.accumulation,
    )

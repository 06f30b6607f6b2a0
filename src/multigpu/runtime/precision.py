"""Mixed precision: autocast around the forward, a GradScaler for float16.

``precision="32"`` does nothing. ``"bf16-mixed"`` runs the forward under
``torch.autocast(dtype=bfloat16)`` (CPU and CUDA); ``"16-mixed"`` under float16 and scales the
loss with a ``torch.amp.GradScaler`` so small gradients do not underflow — the scaler is used by
``ctx.backward`` and ``ctx.step``. Outputs of an autocast forward are cast back to float32, so
the loss (computed outside the model) is float32 as in a full-precision script.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from multigpu.common.choices import PRECISIONS
from multigpu.errors import UsageError

_ALIASES = {
    "32-true": "32",
    "fp32": "32",
    "bf16": "bf16-mixed",
    "16": "16-mixed",
    "fp16": "16-mixed",
}
_DTYPES = {"32": None, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def parse_precision(value: str | int) -> str:
    """Normalise a precision name (``32``, ``"bf16-mixed"``, ``"16-mixed"`` and aliases)."""
    text = str(value).lower()
    text = _ALIASES.get(text, text)
    if text not in PRECISIONS:
        raise UsageError(
            f"precision={value!r} is not known; expected one of {PRECISIONS} "
            "(aliases: 32-true, bf16, 16, fp16)"
        )
    return text


class AutocastModule(nn.Module):
    """Runs the wrapped module's forward under autocast and returns float32 outputs.

    ``multigpu.unwrap_module`` strips it, so state dicts keep their plain keys.
    """

    def __init__(self, module: nn.Module, device_type: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.module = module
        self.device_type = device_type
        self.dtype = dtype

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=self.device_type, dtype=self.dtype):
            out = self.module(*args, **kwargs)
        return _to_float32(out)


def _to_float32(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.float() if obj.is_floating_point() and obj.dtype != torch.float64 else obj
    if isinstance(obj, dict):
        return {k: _to_float32(v) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_to_float32(v) for v in obj))
    if isinstance(obj, list | tuple):
        return type(obj)(_to_float32(v) for v in obj)
    return obj


class Precision:
    """What a precision setting does to the forward, the backward and the optimizer step."""

    def __init__(self, precision: str | int, device: torch.device) -> None:
        self.name = parse_precision(precision)
        self.device = device
        self.dtype = _DTYPES[self.name]
        self.scaler: torch.amp.GradScaler | None = (
            torch.amp.GradScaler(device.type) if self.name == "16-mixed" else None
        )

    def wrap(self, module: nn.Module) -> nn.Module:
        """Wrap ``module`` so its forward runs under autocast (no-op for ``"32"``)."""
        if self.dtype is None:
            return module
        return AutocastModule(module, self.device.type, self.dtype)

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """Autocast for code outside the model's forward (e.g. a loss inside the model step)."""
        if self.dtype is None:
            yield
        else:
            with torch.autocast(device_type=self.device.type, dtype=self.dtype):
                yield

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()``, scaled by the GradScaler for float16."""
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward(**kwargs)

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients back to their true scale before clipping (float16 only)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, *optimizers: torch.optim.Optimizer) -> None:
        """Step every optimizer (skipped by the scaler on inf/NaN gradients), then update it."""
        for optimizer in optimizers:
            if self.scaler is not None:
                self.scaler.step(optimizer)
            else:
                optimizer.step()
        if self.scaler is not None:
            self.scaler.update()

"""The Context's side of the step meter (``multigpu.throughput``): what it is fed, and the read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from multigpu.data import DistributedLoader, StreamLoader
from multigpu.errors import UsageError
from multigpu.instruments.hooks import Hook
from multigpu.runtime import dist
from multigpu.runtime.precision import Precision
from multigpu.session.training import StepControl
from multigpu.throughput import StepMeter


def check_tokens_per_sample(tokens: Any) -> None:
    """Refuse a ``ctx.loader(tokens_per_sample=)`` that is not None or a whole number >= 1."""
    whole = isinstance(tokens, int) and not isinstance(tokens, bool)
    if tokens is not None and not (whole and tokens >= 1):
        raise UsageError(
            f"ctx.loader(tokens_per_sample={tokens!r}); expected a whole number >= 1: the "
            "tokens of one sample, e.g. the sequence length"
        )


class Metering:
    """Context's throughput methods (a mixin: ``Context`` sets the attributes below)."""

    _meter: StepMeter
    _steps: StepControl
    _hooks: tuple[Hook, ...]
    _watching: bool
    _in_ctx_step: bool
    precision: Precision

    def _on_batch(self, loader: DistributedLoader | StreamLoader) -> None:
        self._steps.note_batch(loader)
        self._meter.batch()

    def _watch_optimizers(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """Count the steps of the first optimizer given to ``setup`` that the script steps
        itself (``optimizer.step()``, the README's loop) as ``ctx.step`` counts its own: without
        it, ``ctx.throughput()`` read no step in that loop and returned None for every figure,
        and a profile window never opened."""
        if self._watching or not optimizers:
            return
        self._watching = True
        optimizers[0].register_step_post_hook(self._stepped_by_script)

    def _stepped_by_script(self, *_: Any) -> None:
        if not self._in_ctx_step:  # ctx.step notes its own, once for all its optimizers
            self._note_step()

    def _note_step(self) -> None:
        """An optimizer step stepped: the meter counts it, the hooks hear of it."""
        loader = self._steps.active_loader
        samples = loader.global_batch_size if loader is not None else 0
        self._meter.stepped(samples, getattr(loader, "tokens_per_sample", None))
        for hook in self._hooks:
            hook.on_step(self)

    def throughput(self, *, across_ranks: bool = False) -> dict[str, Any]:
        """Figures of the optimizer steps since the last call (or since ``setup``); a new window
        starts. Call it where a progress line is printed, not at every step.

        A step is one of ``ctx.step``, or of the first optimizer given to ``setup`` stepped by
        the script itself (``optimizer.step()``).

        Keys: ``steps`` (in the window), ``step_seconds`` (mean wall time of one), and over all
        ranks ``samples_per_second`` (the loader's global batch per step) and
        ``tokens_per_second`` (with ``ctx.loader(..., tokens_per_sample=)``, else None);
        ``collective_wait_share``: the share of the step time this rank's main thread waited on
        communication (0.0 on one process; None on CUDA except under DDP; see
        docs/api.md#throughput for what it counts); ``peak_memory_bytes``: this rank's peak
        (CUDA's allocator peak, else the process's peak resident set); ``mfu``: model FLOPs
        utilization on a GPU of the table (``multigpu.throughput.peak``), else None.
        ``across_ranks=True`` adds ``peak_memory_bytes_max`` (the largest over the ranks) and
        ``collective_wait_share_max``; it is a collective: every rank must call it.
        """
        figures = self._meter.read(self.precision.name)
        if across_ranks:
            share = figures["collective_wait_share"]
            found = dist.gather_objects_small((figures["peak_memory_bytes"], share))
            figures["peak_memory_bytes_max"] = max(memory for memory, _ in found)
            shares = [s for _, s in found if s is not None]
            figures["collective_wait_share_max"] = max(shares) if shares else None
        return figures

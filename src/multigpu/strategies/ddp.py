"""``ddp``: DistributedDataParallel, one process per device (the default when world size > 1)."""

from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel
from torch.utils.hooks import RemovableHandle

from multigpu.errors import UsageError
from multigpu.runtime import tbb_malloc
from multigpu.runtime.precision import AutocastModule
from multigpu.strategies.activation_checkpointing import ActivationCheckpointing
from multigpu.strategies.base import Strategy, is_count
from multigpu.strategies.compose import block_units, compose
from multigpu.strategies.compression import parse_compression, register_compression
from multigpu.strategies.materialize import place
from multigpu.strategies.sync_batchnorm import convert_sync_batchnorm


class DDPStrategy(Strategy):
    """Wrap the model in ``DistributedDataParallel``; options pass through to it.

    Args:
        broadcast_buffers: broadcast buffers (e.g. BatchNorm statistics) from rank 0 each forward
            (torch's default, True, when not given).
        gradient_as_bucket_view: True (multigpu's default; torch's is False): each gradient is a
            view into DDP's all-reduce buckets, so there is no copy between them and one
            gradient-sized buffer less per process (200M parameters on 2 CPU processes: 3.5
            instead of 4.3 GiB). False for code that calls ``detach_()`` on a gradient.
        compression: compress the gradient all-reduce: ``"fp16"``, ``"bf16"``, ``"powersgd"`` or
            ``"none"`` (see ``multigpu.strategies.compression``). None (not given): the value of
            ``MULTIGPU_COMPRESSION``, else none.
        powersgd_rank: rank of PowerSGD's approximation (1 sends least; 2-4 keep more).
        powersgd_start_iter: steps all-reduced uncompressed before PowerSGD starts (>= 2).
        activation_checkpointing: recompute activations in the backward, per block (the units
            FSDP would shard): False, True or ``"full"``, ``"selective"`` (keep the matmul and
            attention outputs), or a memory budget in (0, 1) (needs ``init(compile=)``); see
            ``multigpu.strategies.activation_checkpointing``.
    """

    name = "ddp"

    def __init__(
        self,
        *,
        bucket_cap_mb: float | None = None,
        find_unused_parameters: bool = False,
        static_graph: bool = False,
        gradient_as_bucket_view: bool = True,
        broadcast_buffers: bool | None = None,
        compression: str | None = None,
        powersgd_rank: int = 1,
        powersgd_start_iter: int = 10,
        activation_checkpointing: bool | str | float | None = False,
        **ddp_kwargs: Any,
    ) -> None:
        super().__init__()
        self.checkpointing = ActivationCheckpointing.parse(
            activation_checkpointing, owner="DDPStrategy"
        )
        # Refused here: torch would refuse them later, inside the first backward pass.
        if not is_count(powersgd_rank):
            raise UsageError(
                f"powersgd_rank={powersgd_rank!r}; expected an integer >= 1 (the rank of the "
                "gradient approximation: 1 sends least, 2-4 keep more accuracy)"
            )
        if not is_count(powersgd_start_iter) or powersgd_start_iter < 2:
            raise UsageError(
                f"powersgd_start_iter={powersgd_start_iter!r}; expected an integer >= 2: "
                "PowerSGD's error feedback cannot start before DDP has rebuilt its buckets after "
                "the first step"
            )
        self.compression = None if compression is None else parse_compression(compression)
        """The gradient compression; None until given (``resolve_strategy`` fills it in)."""
        self.powersgd_rank = powersgd_rank
        self.powersgd_start_iter = powersgd_start_iter
        self.hook_states: list[Any] = []
        """Each wrapped model's PowerSGD state (``compression_stats()``), in wrapping order."""
        for owned in ("module", "device_ids", "output_device", "process_group"):
            if owned in ddp_kwargs:
                raise UsageError(
                    f"DDPStrategy got {owned}=...; multigpu sets it from the rank's device and "
                    "group; remove it"
                )
        self.options: dict[str, Any] = {
            "find_unused_parameters": find_unused_parameters,
            "static_graph": static_graph,
            "gradient_as_bucket_view": gradient_as_bucket_view,
            **ddp_kwargs,
        }
        if broadcast_buffers is not None:
            # Passed only when asked: torch 2.13 deprecates the name, older torch lacks the new one.
            self.options["broadcast_buffers"] = broadcast_buffers
        if bucket_cap_mb is not None:
            self.options["bucket_cap_mb"] = bucket_cap_mb
        self._wrapped: list[weakref.ref[DistributedDataParallel]] = []
        self._kept = tbb_malloc.KeptBlocks()
        self._step_hooks: list[RemovableHandle] = []

    def wrap(self, module: nn.Module) -> nn.Module:
        if self.sync_batchnorm:
            module = convert_sync_batchnorm(module, self.device)
        module = place(module, self.device)
        # Per block: checkpointing, then compile; the DDP wrap of the root comes last.
        self.composed = compose(
            module,
            block_units(module),
            checkpointing=self.checkpointing,
            backend=self.compile,
        )
        if self.world_size == 1:
            # No process group at world size 1: DDP would have nothing to do.
            return module
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        ddp = DistributedDataParallel(module, device_ids=device_ids, **self.options)
        self._wrapped.append(weakref.ref(ddp))
        state = register_compression(
            ddp,
            self.compression or "none",
            powersgd_rank=self.powersgd_rank,
            powersgd_start_iter=self.powersgd_start_iter,
        )
        if state is not None:
            self.hook_states.append(state)
        return ddp

    def setup(self, module: nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> nn.Module:
        wrapped = super().setup(module, optimizers)
        wanted = self.device.type == "cpu" and self.world_size > 1 and optimizers
        if wanted and not self._step_hooks and tbb_malloc.loaded_tbbmalloc() is not None:
            self._keep_blocks_after_rebuild(optimizers[0])
        return wrapped

    def _keep_blocks_after_rebuild(self, optimizer: torch.optim.Optimizer) -> None:
        """From the second optimizer step on, have oneTBB's allocator keep the large blocks
        freed every step (the optimizer's temporaries, gloo's): at 200M parameters on 2 CPU
        processes 1.7-1.9 s a step instead of 3.0, at a peak of 3.54 GiB instead of 3.47. Not
        before: DDP rebuilds its buckets in the second forward, and the first ones, kept, would
        stay in the cache for good (0.75 GiB more at 200M)."""
        steps = 0

        def after_step(*_: Any) -> None:
            nonlocal steps
            steps += 1
            if steps == 2:
                self._kept.keep()

        self._step_hooks.append(optimizer.register_step_post_hook(after_step))

    def no_sync(self, module: nn.Module) -> contextlib.AbstractContextManager[None]:
        ddp = _ddp(module)
        return ddp.no_sync() if ddp is not None else contextlib.nullcontext()

    def join(self, module: nn.Module) -> contextlib.AbstractContextManager[Any]:
        ddp = _ddp(module)
        return Join([ddp]) if ddp is not None else contextlib.nullcontext()

    def teardown(self) -> None:
        """Free every DDP reducer before the process group is destroyed.

        The user's script usually still holds the DDP object when the Context tears down; its
        reducer would then be freed later, racing gloo's shutdown (an exit deadlock seen with torch
        2.13). Dropping the reducer and its logger now makes the order safe; the wrapper is not
        usable for training afterwards, the plain module (``ctx.unwrap``) still is. Its process
        group goes too: held by the wrapper, gloo's threads would live on into interpreter
        finalization, where one reaching for the GIL aborts the process.
        """
        for handle in self._step_hooks:
            handle.remove()
        self._step_hooks.clear()
        self._kept.release()
        for ref in self._wrapped:
            ddp = ref()
            if ddp is None:
                continue
            for attr in ("logger", "reducer", "process_group"):
                if attr in ddp.__dict__:
                    delattr(ddp, attr)
        self._wrapped.clear()
        self.hook_states.clear()  # PowerSGD's states hold the process group
        gc.collect()

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {"strategy": self.name, **self.options, **self.composition()}
        described["compression"] = self.compression or "none"
        if self.compression == "powersgd":
            described["powersgd_rank"] = self.powersgd_rank
            described["powersgd_start_iter"] = self.powersgd_start_iter
        return described


def _ddp(module: nn.Module) -> DistributedDataParallel | None:
    """The DDP wrapper ``module`` is, under mixed precision's ``AutocastModule`` if any."""
    while isinstance(module, AutocastModule):  # mixed precision wraps outside DDP
        module = module.module
    return module if isinstance(module, DistributedDataParallel) else None

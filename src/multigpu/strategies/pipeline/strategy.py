"""``pipeline``: the model split by depth into stages across processes, micro-batches flowing.

Built on ``torch.distributed.pipelining``: the model is traced once, cut before each split point
(a module name), and each process keeps its stage; GPipe, 1F1B or interleaved 1F1B schedules run
the micro-batches. What multigpu adds around it: split points checked by name (or chosen by
splitting the longest block list evenly), the optimizer kept on this stage's parameters, the
loss on every rank (``ctx.forward_backward``), the whole batch fed to every process (the first
stage reads the inputs, the last the targets), a parameter several stages run kept as one
(``shared_tensors``: tied embeddings, a block run twice), clipping by the whole model's norm,
checkpoints in which each stage saves its part under the unsplit model's names (DCP) with the
optimizer's param groups of the whole model (``optimizer_state``: they resume under any
strategy, schedule or stage count), and the bubble.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import sys
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch import nn

from multigpu import torch_compat
from multigpu.errors import UsageError
from multigpu.runtime.wrappers import unwrap_module
from multigpu.strategies import state
from multigpu.strategies.base import Strategy, is_count, parameter_names, repoint_optimizers
from multigpu.strategies.materialize import place
from multigpu.strategies.pipeline import optimizer_state as by_name
from multigpu.strategies.pipeline.plan import (
    check_microbatches,
    check_schedule,
    check_split_points,
    default_split_points,
    schedule_bubble,
    stages_per_process,
)

if TYPE_CHECKING:  # imported in setup: torch.distributed.pipelining pulls in torch._dynamo
    from multigpu.strategies.pipeline.model import PipelinedModel

log = logging.getLogger(__name__)


class PipelineStrategy(Strategy):
    """Split the model into stages across processes and run micro-batches through them.

    Args:
        example_input: one batch of the model's inputs as the loader gives it (a tensor, or a
            tuple of the forward's positional arguments): the model is traced with a micro-batch
            of it (``torch.export``), so its shape is the training batch's.
        split_points: the modules each stage after the first begins with (e.g.
            ``["blocks.2"]``: stage 0 runs everything before ``blocks.2``); one fewer than the
            stages. None: the longest ``ModuleList``/``Sequential`` is cut into even runs, one
            per stage.
        schedule: ``"1f1b"`` (default: a backward as soon as a forward is done, activations of
            at most ``stages`` micro-batches alive), ``"gpipe"`` (every forward, then every
            backward), or ``"interleaved-1f1b"`` (several stages per process, smaller bubble).
        microbatches: how many micro-batches each batch is split into (>= the stages keeps
            the bubble small; the batch must divide by it).
        stages_per_process: stages each process holds (>1 with ``"interleaved-1f1b"`` only);
            used when ``split_points`` is None.
    """

    name = "pipeline"
    compiles = False  # its stages are traced graphs already (torch.export)
    needs_process_group = True
    forward_is_collective = True

    def __init__(
        self,
        *,
        example_input: Any = None,
        split_points: Sequence[str] | None = None,
        schedule: str = "1f1b",
        microbatches: int = 4,
        stages_per_process: int = 1,
    ) -> None:
        super().__init__()
        self.schedule = check_schedule(schedule)
        self.microbatches = check_microbatches(microbatches)
        if not is_count(stages_per_process):
            raise UsageError(
                f"PipelineStrategy(stages_per_process={stages_per_process!r}): expected a "
                "positive integer (2 or more with schedule='interleaved-1f1b')"
            )
        self.example_input = example_input
        if isinstance(split_points, str):
            split_points = [split_points]
        self.split_points = None if split_points is None else list(split_points)
        if self.split_points is not None and not all(isinstance(p, str) for p in self.split_points):
            raise UsageError(
                f"PipelineStrategy(split_points={split_points!r}): expected a list of module "
                "names, e.g. split_points=['blocks.2']"
            )
        self.requested_per_process = stages_per_process
        self.per_process = stages_per_process
        self._wrapped: list[weakref.ref[PipelinedModel]] = []
        # The whole model's param groups of each optimizer given to setup, by first name.
        self._groups: weakref.WeakKeyDictionary[torch.optim.Optimizer, list[list[str]]] = (
            weakref.WeakKeyDictionary()
        )

    def validate(self) -> None:
        if self.precision.name != "32":
            raise UsageError(
                f"precision={self.precision.name!r} with strategy='pipeline' is not supported; "
                "use precision='32' (or strategy='fsdp' for mixed precision)"
            )
        stages = (
            len(self.split_points) + 1
            if self.split_points is not None
            else self.world_size * self.requested_per_process
        )
        self.per_process = stages_per_process(stages, self.world_size, self.schedule)

    def data_shard(self, rank: int, world_size: int) -> tuple[int, int]:
        """Every process reads the whole batch: the first stage its inputs, the last its targets."""
        return 0, 1

    def no_sync(self, module: nn.Module) -> contextlib.AbstractContextManager[None]:
        """Refused: the schedule averages the gradients it accumulates over its micro-batches,
        so a second batch before ``ctx.step`` would be averaged with the first wrongly."""
        raise UsageError(
            "gradient accumulation (accumulation_steps > 1) with strategy='pipeline': the "
            "pipeline already accumulates over its micro-batches; use accumulation_steps=1 and "
            f"more micro-batches, e.g. PipelineStrategy(microbatches={self.microbatches * 2})"
        )

    def setup(self, module: nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> nn.Module:
        """Split ``module``; keep in each optimizer only the parameters of this process's stages."""
        for optimizer in optimizers:
            if optimizer.state:
                raise UsageError(
                    f"{type(optimizer).__name__} already has state, but strategy='pipeline' "
                    "keeps only this stage's parameters in it; load optimizer state after "
                    "ctx.setup (ctx.load, or Checkpointer.resume), not before"
                )
        names = parameter_names(module)
        first: dict[int, str] = {}
        for name, param in module.named_parameters(remove_duplicate=False):
            first.setdefault(id(param), name)
        for optimizer in optimizers:
            self._groups[optimizer] = by_name.group_names(optimizer, first)
        wrapped = self.wrap(module)
        repoint_optimizers(unwrap_module(wrapped), optimizers, names, drop_missing=True)
        return wrapped

    def wrap(self, module: nn.Module) -> nn.Module:
        if not dist.is_initialized():
            raise UsageError(
                "strategy='pipeline' needs a process group; create the Context with "
                "multigpu.init(strategy=PipelineStrategy(...))"
            )
        if self.example_input is None:
            raise UsageError(
                "strategy='pipeline' traces the model with an example batch, and none was given; "
                "use multigpu.init(strategy=multigpu.PipelineStrategy(example_input=x)) with x "
                "one batch of the model's inputs as the loader gives it"
            )
        stages = self.world_size * self.per_process
        if self.split_points is None:
            points = default_split_points(module, stages)
        else:
            points = check_split_points(module, self.split_points)
        self.split_points = points
        example = self.example_input
        example = tuple(example) if isinstance(example, tuple | list) else (example,)
        example = tuple(x.to(self.device) if isinstance(x, torch.Tensor) else x for x in example)
        module = place(module, self.device)  # the whole model: traced, then cut
        _without_kv_cache(module)
        from multigpu.strategies.pipeline.model import PipelinedModel

        wrapped = PipelinedModel(
            module,
            split_points=points,
            schedule=self.schedule,
            microbatches=self.microbatches,
            per_process=self.per_process,
            example=example,
            device=self.device,
        )
        self._wrapped.append(weakref.ref(wrapped))
        shared = wrapped.sharing.describe()
        if shared and dist.get_rank() == 0:
            log.info(
                "pipeline: parameters run by several stages, kept as one (gradients summed "
                "across the stages holding them): %s",
                shared,
            )
        return wrapped

    def forward_backward(
        self, model: nn.Module, inputs: tuple[Any, ...], target: Any, loss_fn: Any
    ) -> torch.Tensor:
        """One batch's forward and backward through the pipeline; its loss on every rank."""
        return _pipelined(model).train_step(inputs, target, loss_fn)

    def clip_grad_norm(
        self, module: nn.Module, max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clip by the whole model's gradient norm: every stage's part summed across processes,
        a parameter several processes hold counted once."""
        counted = _pipelined(module).sharing.counted()
        grads = [p.grad for p in counted if p.grad is not None]
        local = torch_compat.grad_norm(grads, norm_type)
        if math.isinf(norm_type):
            dist.all_reduce(local, op=dist.ReduceOp.MAX)
            total = local
        else:
            powered = local.double() ** norm_type
            dist.all_reduce(powered)
            total = (powered ** (1.0 / norm_type)).to(local.dtype)
        torch_compat.clip_with_norm(module.parameters(), max_norm, total)
        return total

    # ---- state: each stage its part, under the whole model's names --------------------------
    def full_model_state(self, module: nn.Module) -> dict[str, Any]:
        """Every stage's state gathered on rank 0, as the unsplit model's ``state_dict()``: its
        order, a tied tensor under each of its names (one tensor) (collective)."""
        mine = {k: v.detach().cpu() for k, v in state.model_state(module).items()}
        parts: list[Any] = [None] * self.world_size
        main = dist.get_rank() == 0
        dist.gather_object(mine, parts if main else None, dst=0)
        if not main:
            return {}
        merged = {k: v for part in parts for k, v in part.items()}
        names = _pipelined(module).names
        tied = names.tied()
        whole = {n: merged[tied.get(n, n)] for n in names.order if tied.get(n, n) in merged}
        return {**whole, **{k: v for k, v in merged.items() if k not in whole}}

    def tied_names(self, module: nn.Module) -> dict[str, str]:
        """The unsplit model's tied names (a process holds only its stages' tensors)."""
        if _is_pipelined(module):
            return _pipelined(module).names.tied()
        return super().tied_names(module)

    def optimizer_state(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, *, initialise: bool = False
    ) -> dict[str, Any]:
        """This process's state by parameter name, with the whole model's param groups: the
        form every strategy saves (collective for an optimizer not given to ``ctx.setup``)."""
        groups = self._groups.get(optimizer)
        if groups is None:
            order = _pipelined(module).names.order
            groups = by_name.gathered_group_names(module, optimizer, order)
            self._groups[optimizer] = groups
        return by_name.optimizer_state(module, optimizer, groups, initialise=initialise)

    def load_optimizer_state(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, saved: Mapping[str, Any]
    ) -> None:
        """Load a state saved under any strategy, schedule or stage count."""
        by_name.load_optimizer_state(module, optimizer, saved)

    # ---- reports ------------------------------------------------------------------------------
    def bubble(self, model: nn.Module) -> dict[str, Any]:
        """The bubble: measured idle fraction of each process and the schedule's (collective).

        Measured: 1 - (time inside this process's stage forwards and backwards) / (time in
        ``forward_backward`` steps); the schedule's is ``(p-1)/(v·m+p-1)`` for equal stages.
        """
        compute, wall, steps = _pipelined(model).timings()
        parts: list[Any] = [None] * self.world_size
        dist.all_gather_object(parts, (compute, wall, steps))
        measured = [round(1 - c / w, 3) if w > 0 else None for c, w, _ in parts]
        stages = self.world_size * self.per_process
        return {
            "measured": measured,
            "schedule": round(
                schedule_bubble(self.schedule, stages, self.per_process, self.microbatches), 3
            ),
            "steps": parts[0][2],
        }

    def teardown(self) -> None:
        """Drop the stages and schedules (they hold the process group) before it goes away."""
        for ref in self._wrapped:
            model = ref()
            if model is not None:
                model.release()
        self._wrapped.clear()
        gc.collect()

    def describe(self) -> dict[str, Any]:
        return {
            "strategy": self.name,
            "schedule": self.schedule,
            "microbatches": self.microbatches,
            "stages": self.world_size * self.per_process,
            "stages_per_process": self.per_process,
            "split_points": self.split_points,
        }


def _without_kv_cache(module: nn.Module) -> None:
    """Turn off the key-value cache of the Hugging Face models in ``module``: it serves
    generation, never training, and a forward that returns it (``config.use_cache=True``, the
    decoders' default) cannot be traced as one graph (torch.export refuses it)."""
    for name, sub in module.named_modules():
        config = getattr(sub, "config", None)
        if getattr(config, "use_cache", False) is True:
            config.use_cache = False  # type: ignore[union-attr]
            log.info(
                "pipeline: %s's config.use_cache set to False (a key-value cache is for "
                "generation; a forward that returns it cannot be traced into stages)",
                name or type(sub).__name__,
            )


def _is_pipelined(model: nn.Module) -> bool:
    # A model made by setup: its module is imported then (never at import, see TYPE_CHECKING).
    made = sys.modules.get("multigpu.strategies.pipeline.model")
    return made is not None and isinstance(model, made.PipelinedModel)


def _pipelined(model: nn.Module) -> PipelinedModel:
    if not _is_pipelined(model):
        raise UsageError(
            f"strategy='pipeline' got a {type(model).__name__}; pass the model ctx.setup returned"
        )
    return cast("PipelinedModel", model)

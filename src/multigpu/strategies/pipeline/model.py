"""The model a pipeline hands back: this process's stages, their schedule, and the loss everywhere.

``torch.distributed.pipelining`` traces the whole model once (``torch.export``) and cuts its
graph at the split points; each process keeps its stages (``PipelineStage``) and runs the
schedule. The traced graph holds the shapes it was traced with, so every new input shape (an
evaluation batch of another size) is traced again, once; every trace shares the same parameters.

The user's loop never asks which stage it is: ``train_step`` returns the step's loss on every
process (broadcast from the last stage), and ``forward`` under ``torch.no_grad()`` returns the
last stage's output on every process.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    Pipe,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    SplitPoint,
    pipeline,
)

from multigpu.errors import UsageError
from multigpu.runtime.wrappers import SplitModel
from multigpu.strategies.pipeline.plan import INTERLEAVED, check_batch
from multigpu.strategies.pipeline.shared_tensors import ModelNames, SharedTensors, unique
from multigpu.strategies.pipeline.trace import trace_for_pipeline
from multigpu.torch_compat import unscaled_schedule_kwargs

LossFn = Callable[[Any, Any], torch.Tensor]


@dataclass
class _Runner:
    """This process's stages traced for one input shape, and the schedule that drives them."""

    stages: list[Any]  # torch's PipelineStage (its _PipelineStage, from a traced Pipe)
    schedule: Any
    chunks: int
    has_first: bool
    has_last: bool
    compute_s: float = 0.0
    wall_s: float = 0.0
    steps: int = 0
    loss_fn: LossFn | None = None  # the one of the step being run


class PipelinedModel(SplitModel):
    """This process's stages of a model split into a pipeline (what ``ctx.setup`` returns).

    ``plain`` is the plain view of the stages' parameters under the whole model's names
    (``blocks.2.attn.c_attn.weight``): ``unwrap_module`` knows a ``SplitModel`` and returns it,
    and checkpoints and optimizers see the unsplit model's names. A tensor several stages run
    is one tensor there, under the unsplit model's names (``shared_tensors``).
    """

    def __init__(
        self,
        full: nn.Module,
        *,
        split_points: list[str],
        schedule: str,
        microbatches: int,
        per_process: int,
        example: tuple[Any, ...],
        device: torch.device,
    ) -> None:
        super().__init__()
        self._full = [full]  # kept out of the module tree: traced again for new shapes
        self.split_points = split_points
        self.schedule_name = schedule
        self.microbatches = microbatches
        self.per_process = per_process
        self.device = device
        self.rank = dist.get_rank()
        self.processes = dist.get_world_size()
        self.num_stages = self.processes * per_process
        self.stage_indices = [self.rank + i * self.processes for i in range(per_process)]
        self._traced = False
        self._runners: dict[tuple[Any, ...], _Runner] = {}
        self.names = ModelNames.of(full)
        self._sharing: SharedTensors | None = None
        self._runner(_contiguous(example), training=True)
        self.plain = self.sharing.plain_view()

    @property
    def sharing(self) -> SharedTensors:
        """Which stages run each tensor, and this process's one object for each."""
        assert self._sharing is not None  # made by the first trace, in __init__
        return self._sharing

    # ---- what the training loop calls --------------------------------------------------------
    def train_step(self, inputs: tuple[Any, ...], target: Any, loss_fn: LossFn) -> torch.Tensor:
        """Forward and backward of one batch through the pipeline; the mean loss on every rank.

        Gradients are accumulated into this process's parameters, averaged over the micro-batches
        (the same as ``loss_fn`` over the whole batch when it averages), and a parameter held on
        several processes gets the sum of its holders' gradients on each.
        """
        inputs = _contiguous(inputs)
        runner = self._runner(inputs, training=True)
        runner.loss_fn = loss_fn
        losses: list[torch.Tensor] = []
        start = time.perf_counter()
        runner.schedule.step(
            *(inputs if runner.has_first else ()),
            target=target if runner.has_last else None,
            losses=losses if runner.has_last else None,
            return_outputs=False,
        )
        # Divided here, once per parameter: torch's schedules divide per stage, twice for a
        # parameter two stages of this process share.
        params = unique(p for stage in runner.stages for p in stage.submod.parameters())
        for param in params:
            if param.grad is not None:
                param.grad.div_(runner.chunks)
        self.sharing.sum_gradients(self.device)
        runner.wall_s += time.perf_counter() - start
        runner.steps += 1
        loss = torch.stack([x.detach().float() for x in losses]).mean() if losses else None
        if loss is None:
            loss = torch.zeros((), dtype=torch.float32, device=self.device)
        dist.broadcast(loss, src=self.processes - 1)  # the last stage is the last rank's
        return loss

    def forward(self, *inputs: Any) -> Any:
        """Forward only (evaluation): the last stage's output, on every rank, without gradients."""
        if torch.is_grad_enabled():
            raise UsageError(
                "a pipelined model's forward returns its output without gradients (the backward "
                "runs inside the schedule); train with loss = ctx.forward_backward(model, x, "
                "target=y, loss_fn=...), and call model(x) under torch.no_grad() to evaluate"
            )
        inputs = _contiguous(inputs)
        runner = self._runner(inputs, training=False)
        out = runner.schedule.step(*(inputs if runner.has_first else ()))
        meta = [(tuple(out.shape), out.dtype) if runner.has_last else None]
        dist.broadcast_object_list(meta, src=self.processes - 1)
        shape, dtype = meta[0]  # type: ignore[misc]
        if not runner.has_last:
            out = torch.empty(shape, dtype=dtype, device=self.device)
        dist.broadcast(out, src=self.processes - 1)
        return out

    def timings(self) -> tuple[float, float, int]:
        """(seconds inside this process's stage computations, seconds in training steps, steps)."""
        runners = [r for key, r in self._runners.items() if key[0]]
        return (
            sum(r.compute_s for r in runners),
            sum(r.wall_s for r in runners),
            sum(r.steps for r in runners),
        )

    def release(self) -> None:
        """Drop the stages and schedules (they hold the process group) before it is destroyed."""
        self._runners.clear()
        self._full.clear()

    # ---- tracing and schedules ---------------------------------------------------------------
    def _runner(self, inputs: tuple[Any, ...], *, training: bool) -> _Runner:
        key = (training, *(_shape(x) for x in inputs))
        runner = self._runners.get(key)
        if runner is None:
            runner = self._build(inputs, training)
            self._runners[key] = runner
        return runner

    def _build(self, inputs: tuple[Any, ...], training: bool) -> _Runner:
        batch = _batch_size(inputs)
        chunks = self.microbatches if training or batch % self.microbatches == 0 else 1
        if training:
            check_batch(batch, chunks)
        example = tuple(x[: batch // chunks] if isinstance(x, torch.Tensor) else x for x in inputs)
        full = self._full[0]
        with warnings.catch_warnings():
            # torch 2.13's export warns of its own deprecated LeafSpec on every trace: nothing
            # the user can act on, printed once per process and shape.
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            if not self._traced:  # marks the split points in the model's forwards, once
                split = {p: SplitPoint.BEGINNING for p in self.split_points}
                pipe = trace_for_pipeline(full, lambda: pipeline(full, example, split_spec=split))
                self._traced = True
            else:
                pipe = trace_for_pipeline(full, lambda: Pipe.from_tracing(full, example))
        if pipe.num_stages != self.num_stages:
            raise UsageError(
                f"the split points {self.split_points} cut {type(full).__name__} into "
                f"{pipe.num_stages} stages, not {self.num_stages}: a split point's module runs "
                "more than once or not at all in forward; choose modules that run once, in order"
            )
        modules = {i: pipe.get_stage_module(i) for i in range(pipe.num_stages)}
        if self._sharing is None:  # every stage of the first trace: who runs which tensor
            self._sharing = SharedTensors(
                self.names, modules, local=self.stage_indices, processes=self.processes
            )
        else:  # this trace's copies replaced by the objects trained since the first
            self._sharing.bind({i: modules[i] for i in self.stage_indices})
        del modules
        stages = [pipe.build_stage(i, self.device) for i in self.stage_indices]
        del pipe  # the other stages' graphs are freed with it
        runner = _Runner(
            stages=stages,
            schedule=None,
            chunks=chunks,
            has_first=0 in self.stage_indices,
            has_last=self.num_stages - 1 in self.stage_indices,
        )

        def loss(output: Any, target: Any) -> torch.Tensor:
            assert runner.loss_fn is not None
            return runner.loss_fn(output, target)

        runner.schedule = self._schedule(stages, chunks, loss if training else None)
        if training:
            for stage in stages:
                _time_compute(stage, runner)
        return runner

    def _schedule(self, stages: list[Any], chunks: int, loss: LossFn | None) -> Any:
        if self.schedule_name == INTERLEAVED:
            unscaled = unscaled_schedule_kwargs(ScheduleInterleaved1F1B)
            return ScheduleInterleaved1F1B(stages, chunks, loss_fn=loss, **unscaled)
        kind = Schedule1F1B if self.schedule_name == "1f1b" and loss is not None else ScheduleGPipe
        return kind(stages[0], chunks, loss_fn=loss, **unscaled_schedule_kwargs(kind))


def _time_compute(stage: Any, runner: _Runner) -> None:
    """Count the time the stage computes (forward and backward of a micro-batch): the rest of
    a step's wall time is spent waiting for a neighbour, the pipeline's bubble."""
    for method in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
        original = getattr(stage, method, None)
        if original is None:
            continue

        def timed(*args: Any, _run: Any = original, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return _run(*args, **kwargs)
            finally:
                runner.compute_s += time.perf_counter() - start

        setattr(stage, method, timed)


def _contiguous(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The inputs as the stages were traced with them: torch 2.11's stages refuse a micro-batch
    whose strides differ from the trace's (seen with ``seq[:, :-1]`` batches: "stride mismatch:
    expected (8, 1) actual (9, 1)")."""
    return tuple(x.contiguous() if isinstance(x, torch.Tensor) else x for x in inputs)


def _shape(value: Any) -> Any:
    return (tuple(value.shape), value.dtype) if isinstance(value, torch.Tensor) else type(value)


def _batch_size(inputs: tuple[Any, ...]) -> int:
    for value in inputs:
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    raise UsageError(
        "a pipeline splits its inputs into micro-batches along dim 0, but no input is a tensor "
        "with a batch dimension; pass the batch's tensors (e.g. model inputs x of shape (B, ...))"
    )

"""Context: the one object a training script holds — ranks, device, wrapping, data, collectives.

Made by ``multigpu.init()``; passed explicitly, never a global singleton.
"""

from __future__ import annotations

import atexit
import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn

from multigpu.common import worker_error
from multigpu.data import DistributedLoader, StreamLoader, make_loader
from multigpu.env.types import ClusterEnv
from multigpu.errors import UsageError
from multigpu.instruments.hooks import Hook
from multigpu.runtime import dist
from multigpu.runtime.device import move_to_device
from multigpu.runtime.precision import Precision
from multigpu.session import metrics, rank_memory
from multigpu.session.context_checkpoints import Checkpointing
from multigpu.session.context_comm import RankTools, report_failure
from multigpu.session.context_metering import Metering, check_tokens_per_sample
from multigpu.session.training import StepControl
from multigpu.strategies import AutoStrategy, Strategy
from multigpu.strategies.materialize import MetaRng
from multigpu.throughput import StepMeter

if TYPE_CHECKING:  # made by ctx.checkpointer, which imports it (see context_checkpoints)
    from multigpu.checkpoint.manager import Checkpointer

T = TypeVar("T")


class Context(RankTools, Checkpointing, Metering):
    """Where this process runs and how to train in it.

    Use it as a context manager (or rely on the exit hook) so the process group is torn down
    cleanly, also when the script raises.
    """

    def __init__(
        self,
        *,
        env: ClusterEnv,
        device: torch.device,
        strategy: Strategy,
        backend: str | None,
        timeout: timedelta,
        seed: int | None,
        owns_process_group: bool,
        precision: Precision | None = None,
        hooks: Sequence[Hook] = (),
        flops_per_token: float | None = None,
    ) -> None:
        self.env = env
        self.device = device
        self.strategy = strategy
        self.backend = backend
        self.timeout = timeout
        self.seed = seed
        self.precision = precision or Precision("32", device)
        self._hooks = tuple(hooks)  # instruments chosen by init() (verify, bench, hang tools)
        self._steps = StepControl(
            strategy,
            self.precision,
            self._comm_device,
            lambda optimizers: all(hook.before_step(self, optimizers) for hook in self._hooks),
        )
        self._meter = StepMeter(device, env.world_size, flops_per_token=flops_per_token)
        self._backward = self._steps.backward
        for hook in self._hooks:
            self._backward = hook.wrap_backward(self, self._backward)
        self._owns_process_group = owns_process_group
        self._closed = False
        self._checkpointers: list[Checkpointer] = []
        self._meta_rng = MetaRng()
        self._trained: tuple[nn.Module | None, tuple[torch.optim.Optimizer, ...]] = (None, ())
        self._watching = self._in_ctx_step = False  # see Metering._watch_optimizers
        metrics.enter(self)  # its metrics ask it whether this rank's data repeats another's
        atexit.register(self.teardown)

    def __repr__(self) -> str:
        return (
            f"Context(rank={self.rank}, world_size={self.world_size}, device={self.device}, "
            f"strategy={self.strategy.name}, backend={self.backend}, source={self.env.source})"
        )

    @property
    def compile(self) -> str | None:
        """The ``torch.compile`` backend of ``setup``'s blocks (``init(compile=)``); None: off."""
        return self.strategy.compile

    # ---- model and optimizer ------------------------------------------------------------------
    def setup(self, model: nn.Module, *optimizers: torch.optim.Optimizer) -> Any:
        """Move ``model`` to this rank's device and wrap it (DDP, FSDP, DP or nothing).

        Create optimizers on the plain model's parameters before calling this: they stay
        attached (FSDP's sharded parameters replace the originals and the optimizers are
        re-pointed at them by name). A model built in ``init_module()`` is allocated and
        initialised here, only the part this rank holds. Under ``strategy="auto"`` with several
        processes the memory estimate chooses between DDP and FSDP (one line says which, why);
        ``ctx.strategy`` stays the same object, delegating to the choice.

        Returns:
            The wrapped model alone, or ``(model, optimizer, ...)`` when optimizers are given.
        """
        if not isinstance(model, nn.Module):
            raise UsageError(
                f"setup() got {type(model).__name__} as the model; expected a torch.nn.Module"
            )
        if isinstance(self.strategy, AutoStrategy) and self.is_distributed:
            # Once (the first model decides); the same object then delegates to its choice.
            self.strategy.decide(lambda: rank_memory.choose_for_memory(self, model, optimizers))
        self._meter.note_model(model)  # the whole model, before a strategy shards or splits it
        # For the estimate an out-of-memory error gives: set before _memory_said reads it.
        self._trained = (model, optimizers)
        with self._meta_rng.drawing(model), self._memory_said("ctx.setup"):
            wrapped = self.strategy.setup(model, optimizers)
        if not self.strategy.handles_precision:
            wrapped = self.precision.wrap(wrapped)
        self._steps.note_setup(wrapped, optimizers)
        self._watch_optimizers(optimizers)
        self._meter.note_wrapped(wrapped, self.strategy.name)
        for hook in self._hooks:
            hook.on_setup(self, wrapped, optimizers)
        if not optimizers:
            return wrapped
        return (wrapped, *optimizers)

    @contextlib.contextmanager
    def init_module(self) -> Iterator[None]:
        """Build the model inside this block on the meta device: no memory, no values yet.

        ``ctx.setup`` then allocates only what this rank holds (its FSDP shards, or the whole
        model for DDP) and initialises it with each module's ``reset_parameters()`` — to the
        values ``model = Net()`` would have had with the same seed, at any world size. Build
        only the model here: every tensor made inside is a meta tensor.
        """
        self._meta_rng.remember()
        with torch.device("meta"):
            yield

    @property
    def mesh(self) -> Any:
        """The strategy's named ``DeviceMesh``, or None (FSDP: axis ``dp_shard``; HSDP:
        ``dp_replicate, dp_shard``; tensor parallel: ``dp_shard, tp``)."""
        return self.strategy.mesh

    def full_state_dict(self, model: nn.Module) -> dict[str, Any]:
        """The model's whole state dict on the CPU, unwrapped, on rank 0 (other ranks: ``{}``).

        Under FSDP the shards are gathered (every rank must call it); use it to write a
        ``model.pt`` that ``model.load_state_dict(torch.load(...))`` takes anywhere.
        """
        return self.strategy.full_model_state(model)

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The plain module behind a wrapped one: its ``state_dict()`` has no ``module.`` prefix."""
        return self.strategy.unwrap(model)

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        """Skip DDP's gradient all-reduce inside the block (for gradient accumulation)."""
        return self.strategy.no_sync(model)

    def backward(self, loss: torch.Tensor, *, num_items: Any = None, **kwargs: Any) -> None:
        """``loss.backward()``, scaled for float16 and normalised over the optimizer step.

        With a mean ``loss``: divided by the micro-steps inside ``accumulate``; DDP and FSDP
        average over the ranks, so the gradient is the mean of the micro-batches' means.

        With ``num_items`` (an int, float or one-element tensor): ``loss`` is a *sum* over that
        many items (tokens, say: ``reduction="sum"``, and ``num_items=(labels != -100).sum()``).
        At the micro-batch that ends the step, one all-reduce adds up every rank's and
        micro-batch's items and the gradients are rescaled, so they are those of the mean over
        every item of the step — the same at any world size and accumulation, however the items
        fall into micro-batches (padding). Give it on every micro-batch of a step or on none,
        once per micro-batch (add a micro-batch's losses and counts first);
        ``ctx.step_loss`` is then the step's mean loss per item.
        """
        self._meter.work()
        with self._memory_said("ctx.backward"):
            self._backward(loss, num_items=num_items, **kwargs)
        self._meter.backward_ended()

    @property
    def step_loss(self) -> float | None:
        """The global mean loss per item of the last optimizer step whose ``ctx.backward``
        calls gave ``num_items`` (every rank's and micro-batch's loss sums over their items,
        the same number on every rank), or None before one ended. Reading it waits for the GPU.
        """
        last = self._steps.last_loss
        return None if last is None else float(last)

    def step(self, *optimizers: torch.optim.Optimizer, zero_grad: bool = True) -> bool:
        """Step the optimizer(s) at the end of an optimizer step, then zero the gradients.

        Inside ``accumulate`` on a micro-batch that does not end its step it does nothing; with
        ``precision="16-mixed"`` it goes through the GradScaler. Returns whether it stepped.
        """
        self._in_ctx_step = True  # its optimizers' steps are noted here, not by their hook
        try:
            with self._memory_said("ctx.step"):
                stepped = self._steps.step(*optimizers, zero_grad=zero_grad)
        finally:
            self._in_ctx_step = False
        if stepped:
            self._note_step()  # the step meter and the hooks (a profiler's window)
        return stepped

    def forward_backward(
        self,
        model: nn.Module,
        *inputs: Any,
        target: Any,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        num_items: Any = None,
    ) -> torch.Tensor:
        """``loss_fn(model(*inputs), target)`` and its backward; the loss (detached) on every rank.

        The same call under every strategy, so the loop never asks which stage it runs. Under
        ``strategy="pipeline"`` the batch runs through the schedule in micro-batches (the first
        stage reads ``inputs``, the last computes ``loss_fn``) and the returned loss is the mean
        over the micro-batches, broadcast from the last stage. Under any other strategy it is
        the model's forward, ``loss_fn`` and ``ctx.backward`` (inside ``ctx.accumulate`` the
        loss is divided there), returning this rank's loss. Step with ``ctx.step`` after it.

        With ``num_items`` (see ``backward``), ``loss_fn`` returns a sum over the items of its
        output and ``num_items`` counts the items of the batch given; the loss returned is per
        item (under a pipeline, whose processes all hold the whole batch, each micro-batch's
        sum is weighted so that the schedule's average over them is the batch's mean per item).
        """
        if not callable(loss_fn):
            raise UsageError(
                f"forward_backward(loss_fn={loss_fn!r}): expected a function of (output, "
                "target) returning the loss, e.g. loss_fn=torch.nn.functional.cross_entropy"
            )
        self._meter.work()
        if num_items is None:
            done = self.strategy.forward_backward(model, inputs, target, loss_fn)
        else:
            done = self._steps.weighted_schedule(model, inputs, target, loss_fn, num_items)
        if done is not None:
            return done
        loss = loss_fn(model(*inputs), target)
        self.backward(loss, num_items=num_items)
        return loss.detach() if num_items is None else loss.detach() / num_items

    def _memory_said(self, where: str) -> contextlib.AbstractContextManager[None]:
        """A failed allocation becomes one line: the rank, the step, what would fit."""
        return rank_memory.said_in_one_line(where, self, *self._trained)

    def accumulate(
        self, model: nn.Module, sync: bool | None = None
    ) -> contextlib.AbstractContextManager[None]:
        """Gradient accumulation over the loader's ``accumulation_steps`` micro-batches.

        Wrap each micro-batch's forward, ``ctx.backward`` and ``ctx.step`` in it: every
        micro-batch but the last of an optimizer step skips DDP's all-reduce (``no_sync``) and
        ``ctx.step``; the loss is divided by the number of micro-steps (a sum with ``num_items``
        is weighted instead: see ``backward``). ``sync`` overrides the loader's judgement (for
        loops that do not use ``ctx.loader``).

        Example:
            >>> import torch.nn.functional as F
            >>> from torch.utils.data import TensorDataset
            >>> import multigpu
            >>> ds = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
            >>> model = nn.Linear(4, 2)
            >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            >>> with multigpu.init(seed=0) as ctx:
            ...     model, optimizer = ctx.setup(model, optimizer)
            ...     loader = ctx.loader(ds, batch_size=16, accumulation_steps=4)
            ...     steps = 0
            ...     for x, y in loader:
            ...         with ctx.accumulate(model):
            ...             ctx.backward(F.cross_entropy(model(x), y))
            ...             steps += ctx.step(optimizer)
            >>> steps  # 64 samples, global batches of 16 in 4 micro-batches: 4 optimizer steps
            4
        """
        return self._steps.accumulate(model, sync)

    @property
    def sync_step(self) -> bool:
        """False on a micro-batch that does not end its optimizer step, from ``accumulate``
        until the loader's next batch (``ctx.step`` may follow the block)."""
        return self._steps.sync_step

    def clip_grad_norm(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        max_norm: float,
        norm_type: float = 2.0,
    ) -> torch.Tensor | None:
        """Clip the gradient norm (unscaled first under float16); None on a non-final micro-step.

        The norm is over the whole model's gradient (under FSDP: over every rank's shards, the
        same number DDP gives); it is returned as it was before clipping.
        """
        return self._steps.clip_grad_norm(model, optimizer, max_norm, norm_type)

    def join(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Train through uneven inputs: ranks out of batches shadow the others' all-reduces.

        Needed only with ``ctx.loader(..., drop_last=False)`` for training, where the last step
        can give some ranks a batch fewer; without it those ranks would leave DDP waiting. Uses
        ``torch.distributed.algorithms.join.Join``; a no-op without DDP.
        """
        return self.strategy.join(model)

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """The precision's autocast, for computation outside the model's forward."""
        return self.precision.autocast()

    # ---- data ---------------------------------------------------------------------------------
    def loader(
        self,
        dataset: Any,
        batch_size: int,
        shuffle: bool = True,
        *,
        seed: int | None = None,
        drop_last: bool | None = None,
        accumulation_steps: int = 1,
        move_to_device: bool = True,
        tokens_per_sample: int | None = None,
        **dataloader_kwargs: Any,
    ) -> DistributedLoader | StreamLoader:
        """A loader over this rank's shard; ``batch_size`` is the GLOBAL batch per optimizer step.

        Each rank gets ``batch_size / (world_size * accumulation_steps)`` samples per batch (under
        tensor parallelism the world is the data-parallel ranks: a TP group shares its batch); the
        global order depends on (seed, epoch) only, and the epoch advances by itself at each pass
        (no ``set_epoch``). Batches arrive on ``ctx.device`` unless ``move_to_device=False``.
        ``tokens_per_sample``: tokens in one sample (a sequence's length), for the tokens/s
        and MFU of ``ctx.throughput()``.

        A stream (a ``torch.utils.data.IterableDataset`` or a Hugging Face
        ``datasets.IterableDataset``) gets a ``StreamLoader``: every rank keeps its part of the
        same global batches, reading it whole, or only its lanes of a stream with shards (a
        Hugging Face stream over several files); ``buffer_size=`` sets its shuffle buffer,
        ``lanes=`` its lanes (``multigpu.data.stream_loader``, ``multigpu.data.stream_lanes``).
        """
        check_tokens_per_sample(tokens_per_sample)
        # The data-parallel ranks split the data; a tensor-parallel group shares one batch.
        data_rank, data_ranks = self.strategy.data_shard(self.rank, self.world_size)
        loader = make_loader(
            dataset,
            batch_size=batch_size,
            rank=data_rank,
            world_size=data_ranks,
            shuffle=shuffle,
            seed=seed if seed is not None else (self.seed or 0),
            drop_last=drop_last,
            accumulation_steps=accumulation_steps,
            device=self.device if move_to_device else None,
            # Read at each pass: loaders made before setup follow auto's choice (FSDP's
            # forwards are collectives: every rank needs a batch, maybe an empty one).
            even_batches=lambda: self.strategy.forward_is_collective,
            **dataloader_kwargs,
        )
        loader.tokens_per_sample = tokens_per_sample
        loader.on_batch = self._on_batch
        for hook in self._hooks:
            hook.on_loader(self, loader)
        return loader

    def to_device(self, obj: T) -> T:
        """Move tensors (also nested in dicts, lists, dataclasses) or a module to ``device``."""
        return move_to_device(obj, self.device)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Send ``metrics`` (numbers or one-element tensors) at ``step`` to the trackers of
        ``init(log_to=...)``, from rank 0; elsewhere it only checks the values (with no tracker
        it does nothing) and never communicates, so reduce a value first where every rank's
        share counts. A resumed run does not send again a step its trackers already have; a
        value logged again at its step, or below a step this job logged, is not sent (one
        warning line says so; see docs/api.md)."""
        for hook in self._hooks:
            outside = hook.on_log(self, metrics, step)
            if outside:  # a tracker's start-up: not the training's time
                self._meter.exclude(outside)

    # ---- lifetime -----------------------------------------------------------------------------
    def teardown(self) -> None:
        """Release wrappers and destroy the process group (idempotent; also runs at exit)."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.teardown)
        for ckpt in self._checkpointers:  # a background save must end before the group does
            ckpt.close()
        self._meter.close()  # the wait clock stops listening to torch.distributed's tap
        for hook in self._hooks:
            hook.on_teardown(self)
        self.strategy.teardown()
        metrics.leave(self)
        if self._owns_process_group:
            dist.destroy_process_group()

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        error = exc[1] if isinstance(exc[1], BaseException) else None
        ending: Exception | None = None
        for hook in () if self._closed else self._hooks:
            try:
                hook.on_exit(self, error)
            except Exception as e:  # the trackers' last steps not written: the others still end
                ending = ending or e
        self.teardown()
        if ending is not None and error is None:  # a block that ended well failed at its end
            report_failure(ending, self.env)
            raise ending
        if ending is not None:  # a hook's own bug while the block failed: both are said
            raise ending from error
        recorded = report_failure(error, self.env)
        if recorded and worker_error.is_consequence(error) and worker_error.launched_by_multigpu():
            # Another rank failed first and its error is the one to read; this rank's traceback
            # (a lost connection, 20 lines) is kept in its error file, not printed.
            raise SystemExit(1) from None

"""Context: the one object a training script holds — ranks, device, wrapping, data, collectives,
checkpoints and throughput.

Made by ``multigpu.init()``; passed explicitly, never a global singleton. One class in one file,
in sections: ranks and collectives, model and optimizer, data, checkpoints, throughput, lifetime.
Every collective works at world size 1 too, where it returns its input.

Checkpoints: the strategy is the state adapter: it produces and loads the model and optimizer
state as its wrapping holds it. ``ctx.save``'s checkpoint is the same kind of directory a
``Checkpointer`` writes (sharded through DCP, atomic, with a manifest and checksums), without RNG
states. The modules that save and load (DCP, and through it DTensor, FSDP and torch's elastic
agent: about 1 s of CPU in every process) are imported by the methods that need them, so that a
run that never checkpoints starts without them.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import functools
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import torch
from torch import nn

from multigpu.common import worker_error
from multigpu.data import DistributedLoader, StreamLoader, make_loader
from multigpu.env.types import ClusterEnv
from multigpu.errors import UsageError
from multigpu.instruments.hooks import Hook
from multigpu.replicas.settings import group_directory
from multigpu.runtime import dist
from multigpu.runtime.device import move_to_device
from multigpu.runtime.precision import Precision
from multigpu.session import metrics, rank_memory
from multigpu.session.step import OptimizerStep
from multigpu.strategies import AutoStrategy, Strategy
from multigpu.strategies.materialize import MetaRng
from multigpu.throughput import StepMeter

if TYPE_CHECKING:  # made by ctx.checkpointer, which imports it (see the module doc)
    from multigpu.checkpoint.native.manager import Checkpointer

log = logging.getLogger(__name__)

T = TypeVar("T")


def check_tokens_per_sample(tokens: Any) -> None:
    """Refuse a ``ctx.loader(tokens_per_sample=)`` that is not None or a whole number >= 1."""
    whole = isinstance(tokens, int) and not isinstance(tokens, bool)
    if tokens is not None and not (whole and tokens >= 1):
        raise UsageError(
            f"ctx.loader(tokens_per_sample={tokens!r}); expected a whole number >= 1: the "
            "tokens of one sample, e.g. the sequence length"
        )


class Context:
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
        self._meter = StepMeter(device, env.world_size, flops_per_token=flops_per_token)
        self._steps = OptimizerStep(
            strategy,
            self.precision,
            self._comm_device,
            self._meter,
            before_step=lambda opts: all(hook.before_step(self, opts) for hook in self._hooks),
            after_step=self._after_step,
        )
        for hook in self._hooks:
            self._steps.wrap_backward(functools.partial(hook.wrap_backward, self))
        self._owns_process_group = owns_process_group
        self._closed = False
        self._checkpointers: list[Checkpointer] = []
        self._meta_rng = MetaRng()
        self._trained: tuple[nn.Module | None, tuple[torch.optim.Optimizer, ...]] = (None, ())
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

    # ---- ranks and collectives ---------------------------------------------------------------
    @property
    def rank(self) -> int:
        """Global rank of this process."""
        return self.env.rank

    @property
    def local_rank(self) -> int:
        """Rank of this process on its node (its GPU index when on CUDA)."""
        return self.env.local_rank

    @property
    def world_size(self) -> int:
        """Number of processes in the job."""
        return self.env.world_size

    @property
    def local_world_size(self) -> int:
        """Number of processes on this node."""
        return self.env.local_world_size

    @property
    def node_rank(self) -> int:
        """Index of this node."""
        return self.env.node_rank

    @property
    def num_nodes(self) -> int:
        """Number of nodes in the job."""
        return self.env.num_nodes

    @property
    def repeats_data(self) -> bool:
        """Whether this rank reads the same data as a lower rank (a tensor-parallel group, a
        pipeline's processes: ``Strategy.data_shard``); its metrics' states then stay out of
        ``compute()``'s sums, so that each sample counts once."""
        shard_of = self.strategy.data_shard
        mine = shard_of(self.rank, self.world_size)[0]
        return any(shard_of(r, self.world_size)[0] == mine for r in range(self.rank))

    @property
    def is_main(self) -> bool:
        """True on global rank 0 (the one that prints and writes files). Under replica groups
        (``multigpu run --replicas``) on one process of the whole job: rank 0 of the group that
        writes (see docs/fault-tolerance.md)."""
        return self.env.rank == 0 and all(hook.writes_outputs(self) for hook in self._hooks)

    @property
    def is_distributed(self) -> bool:
        """True when more than one process takes part."""
        return self.env.world_size > 1

    def barrier(self) -> None:
        """Wait until every rank arrives (bounded by the timeout)."""
        dist.barrier()

    def all_reduce(self, value: T, op: dist.ReduceOp = "mean") -> T:
        """Reduce a tensor or number over ranks: ``mean``, ``sum``, ``max``, ``min``, ``prod``."""
        return dist.all_reduce(value, op=op, device=self._comm_device())

    def reduce(self, value: Any, op: str = "sum") -> NoReturn:
        """Removed (it was an all-reduce, unlike torch's ``reduce`` to one rank): use
        ``ctx.all_reduce(value, op="sum")``. Raises UsageError saying so, for one release."""
        raise UsageError(
            f"ctx.reduce(value, op={op!r}) was renamed: it is an all-reduce (every rank gets the "
            f"result), unlike torch.distributed.reduce; use ctx.all_reduce(value, op={op!r})"
        )

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
        sep, end = kwargs.pop("sep", None), kwargs.pop("end", None)
        text = (" " if sep is None else sep).join(str(a) for a in args)
        if all_ranks and self.is_distributed:
            text = f"[rank{self.rank}] {text}"
        # Text and end in one write: print() writes them apart, and with unbuffered output (the
        # launcher's PYTHONUNBUFFERED) another rank's line landed between them ("[rank0] a[rank1]
        # a"). file=None, end=None: print's defaults.
        builtins.print(text + ("\n" if end is None else end), end="", flush=True, **kwargs)

    @contextlib.contextmanager
    def rank_zero_first(self) -> Iterator[None]:
        """Let rank 0 run the block first (e.g. a download), then the others."""
        if not self.is_main:
            self.barrier()
        yield
        if self.is_main:
            self.barrier()

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
        with self._memory_said("ctx.backward"):
            self._steps.backward(loss, num_items=num_items, **kwargs)

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
        with self._memory_said("ctx.step"):
            return self._steps.step(*optimizers, zero_grad=zero_grad)

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
        done = self._steps.forward_backward(model, inputs, target, loss_fn, num_items)
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
        loader.on_batch = self._steps.note_batch
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

    # ---- checkpoints --------------------------------------------------------------------------
    def checkpointer(
        self,
        directory: str | Path,
        *,
        every_steps: int | None = None,
        keep: int | None = None,
        async_save: bool = False,
        save_on_sigterm: bool = False,
        lock_timeout: float = 0.0,
        **objects: Any,
    ) -> Checkpointer:
        """A ``Checkpointer`` saving ``objects`` (and the GradScaler of ``16-mixed``) under
        ``directory``: every ``every_steps`` calls of ``step()``, keeping the ``keep`` newest
        (None: all); ``async_save`` writes in the background; ``save_on_sigterm`` saves and exits
        143 when any rank gets SIGTERM. One run at a time holds ``directory``: another live
        run's raises ``CheckpointLockedError`` (naming its pid and host) unless it lets go
        within ``lock_timeout`` seconds; a dead run's hold ends with it. See
        ``multigpu.checkpoint.native.manager``.
        """
        from multigpu.checkpoint.native.manager import Checkpointer

        ckpt = Checkpointer(
            group_directory(directory, os.environ),  # under --replicas: DIR/group-G
            rank=self.rank,
            world_size=self.world_size,
            adapter=self.strategy,
            comm_device=self._comm_device(),
            timeout=self.timeout.total_seconds(),
            every_steps=every_steps,
            keep=keep,
            async_save=async_save,
            save_on_sigterm=save_on_sigterm,
            describe=self.strategy.describe,
            lock_timeout=lock_timeout,
            before_save=self._before_save,
            counts_step=lambda: all(hook.counts_step(self) for hook in self._hooks),
        )
        ckpt.track(**objects)
        if self.precision.scaler is not None and "grad_scaler" not in objects:
            ckpt.track(grad_scaler=self.precision.scaler)
        self._checkpointers.append(ckpt)
        for hook in self._hooks:
            hook.on_checkpointer(self, ckpt)
        return ckpt

    def save(self, path: str | Path, state: Mapping[str, Any]) -> Path:
        """Save ``state`` — models, optimizers, loaders, schedulers, plain values — at ``path``.

        Collective: every rank calls it. The checkpoint is a directory written atomically (a
        temp dir renamed once complete, with a manifest and checksums); models and optimizers
        are sharded through DCP, so it loads on any world size under any strategy. RNG states
        are not saved (use a ``Checkpointer`` for exact resume). An existing ``path`` is
        replaced only when it is a multigpu checkpoint.
        """
        from multigpu.checkpoint.native.saving import save_state

        _check_names(state, "save")
        return save_state(
            Path(path),
            state,
            rank=self.rank,
            world_size=self.world_size,
            adapter=self.strategy,
            strategy=self.strategy.describe(),
            before=self._before_save,
        )

    def _before_save(self) -> None:
        """A checkpoint is about to be saved: the hooks hear of it (the trackers flush)."""
        for hook in self._hooks:
            hook.on_save(self)

    def load(self, path: str | Path, state: MutableMapping[str, Any]) -> dict[str, Any]:
        """Fill ``state`` in place from a checkpoint; return the saved entries it did not ask for.

        ``path``: a directory written by ``ctx.save``, a ``Checkpointer``'s ``step-*``
        directory, or a ``Checkpointer``'s directory (its newest complete checkpoint). Models
        and optimizers are loaded into the objects (resharded to this run), plain values are
        replaced in ``state``. Collective: every rank calls it. The saved plain values and small
        objects' states that ``state`` has no entry for are returned (saved model and optimizer
        states not asked for stay on disk).

        Also read: a plain DCP checkpoint (a directory written by
        ``torch.distributed.checkpoint.save``, or its ``.metadata``; torchtitan's step
        directories), whose top-level objects are the names to ask for — its top-level tensors
        are ``model`` (see ``multigpu.checkpoint.formats.dcp_load``); and weights in the hub
        format (a ``.safetensors`` file, or a directory with ``model.safetensors`` or its index)
        with ``{"model": model}``: after ``ctx.setup``, each rank reads only the part of each
        tensor it holds (its rows under FSDP; see ``multigpu.checkpoint.formats.hub_load``).
        """
        from multigpu.checkpoint.dispatch import load_state

        _check_names(state, "load")
        return load_state(path, state, self.strategy, rank=self.rank)

    # ---- throughput ---------------------------------------------------------------------------
    def _after_step(self) -> None:
        """An optimizer step stepped (``ctx.step`` or the script's own): the hooks hear of it."""
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
        # Recorded before the teardown, which can take seconds (a process group whose peer is
        # gone, the trackers' last writes): a rank that failed the same way and ended sooner
        # has the agent stop this one, which then had no record and the line named the other.
        # What the line names: the block's error, or a hook's failure at a block that ended
        # well; neither when a hook failed while the block failed (both are raised, as before).
        both = ending is not None and error is not None
        recorded = False if both else worker_error.record(error if error is not None else ending)
        self.teardown()
        if ending is not None and error is None:  # a block that ended well failed at its end
            report_failure(ending, self.env, recorded=recorded)
            raise ending
        if ending is not None:  # a hook's own bug while the block failed: both are said
            raise ending from error
        recorded = report_failure(error, self.env, recorded=recorded)
        if recorded and worker_error.is_consequence(error) and worker_error.launched_by_multigpu():
            # Another rank failed first and its error is the one to read; this rank's traceback
            # (a lost connection, 20 lines) is kept in its error file, not printed.
            raise SystemExit(1) from None


def report_failure(
    error: BaseException | None, env: ClusterEnv, *, recorded: bool | None = None
) -> bool:
    """Record ``error`` for the launcher's one-line summary (``multigpu.common.worker_error``); True
    when recorded (``recorded``: it was already, with that outcome). A usage error then ends a
    torchrun worker: one line on stderr, exit code 2 (what the launcher reports as the user's
    error, not a crash).

    ``multigpu run`` prints the line itself (read from the worker's error file), so the worker
    stays silent. Under plain torchrun the worker says it: every rank usually refuses the same
    input, so a rank other than 0 waits a moment, in which the agent stops it once rank 0 has
    exited, and the message appears once; if rank 0 did not refuse, it still appears, from the
    rank that did.
    """
    if recorded is None:
        recorded = worker_error.record(error)
    if not isinstance(error, UsageError) or env.source != "torchrun":
        return recorded
    if not (recorded and worker_error.launched_by_multigpu()):
        if env.rank != 0:
            time.sleep(1.0)
        prefix = f"rank {env.rank}: " if env.rank else ""
        print(f"multigpu: error: {prefix}{error}", file=sys.stderr, flush=True)
    raise SystemExit(2) from error


def _check_names(state: Mapping[str, Any], verb: str) -> None:
    if not isinstance(state, Mapping) or not state:
        raise UsageError(
            f"ctx.{verb} got {type(state).__name__}; expected a non-empty dict such as "
            '{"model": model, "optimizer": optimizer, "step": 100}'
        )
    bad = [k for k in state if not (isinstance(k, str) and k.isidentifier())]
    if bad:
        raise UsageError(
            f"ctx.{verb}: state keys {bad!r} are not identifiers; name each entry like a "
            'variable, e.g. {"model": model}'
        )

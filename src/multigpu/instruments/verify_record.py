"""The worker side of ``multigpu verify``: record losses, steps and final parameters.

A Context hook (``multigpu.instruments.hooks``), attached by ``init()`` when ``multigpu verify``
starts the worker (``MULTIGPU_VERIFY_DIR`` is set, see ``multigpu.session.initialize``). It sees
every loss passed to ``ctx.backward``, every optimizer step (through
``Optimizer.register_step_post_hook``, so a plain ``optimizer.step()`` counts too), the models and
loaders the Context set up. After ``MULTIGPU_VERIFY_STEPS`` optimizer steps it writes what it saw
and stops the script with ``VerifyStop`` (a clean ``SystemExit(0)``); a script that ends sooner is
recorded at teardown. Files, in ``MULTIGPU_VERIFY_DIR``:

- ``rank{r}.json``: ``{"rank", "world_size", "steps", "losses" (this rank's mean loss of each
  optimizer step, or the global mean per item ``ctx.step_loss`` where ``ctx.backward`` got
  ``num_items``; null where ``ctx.backward`` was not used), "weighted_backward" (calls with
  ``num_items``), "mean_over_ignored" ({"calls", "ignored", "targets", "share", "varies"}:
  calls without it whose loss is a cross-entropy mean over targets some of which are
  ``ignore_index``; ``share``: the first call's ``[ignored, targets]`` in lowest terms,
  ``varies``: whether a later call's share differed), "gradient_noise" ({parameter name: the
  largest, over the optimizer steps, of its gradient's root mean square divided by that of the
  gradients of the module that holds it (its own parameters)}), "loaders"
  [{"global_batch_size", "num_samples", "shuffle", "accumulation_steps", "seed"}], "dropout"
  [module names], "dtype", "optimizers" (class names), "precision", "deterministic",
  "strategy", "batchnorm" ({module name: true when synchronised across ranks (SyncBatchNorm),
  else false})}``;
- ``params.pt`` (rank 0): the unwrapped models' ``state_dict`` on CPU (``model{i}.`` prefixed
  when there are several).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from multigpu import torch_compat
from multigpu.common.atomic_file import atomic_write
from multigpu.instruments.hooks import Hook
from multigpu.strategies.base import unwrap_module
from multigpu.strategies.sync_batchnorm import CPUSyncBatchNorm

_DROPOUT = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)
_SYNCED_BATCHNORM = (nn.SyncBatchNorm, CPUSyncBatchNorm)
"""BatchNorm whose statistics cover every rank's batch: the same on every rank."""
_BATCHNORM = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, *_SYNCED_BATCHNORM)


class VerifyStop(SystemExit):
    """Raised after the last step ``multigpu verify`` asked for: ends the script cleanly."""

    def __init__(self) -> None:
        super().__init__(0)


class VerifyRecorder(Hook):
    """Collects what ``multigpu verify`` compares across world sizes (see the module doc)."""

    FILE = "rank{rank}.json"

    def __init__(self, directory: Path, steps: int, rank: int, world_size: int) -> None:
        self.directory = directory
        self.max_steps = steps
        self.rank = rank
        self.world_size = world_size
        self.models: list[nn.Module] = []
        self.full_states: list[Callable[[nn.Module], dict[str, Any]]] = []
        self.optimizers: list[str] = []
        self.loaders: list[dict[str, Any]] = []
        self.losses: list[float | None] = []
        self._pending: list[float] = []
        self._weighted_pending = False  # a ctx.backward of this step got num_items
        self.weighted = 0
        self.mean_over_ignored: dict[str, Any] = {"calls": 0, "ignored": 0, "targets": 0}
        self.gradient_noise: dict[str, float] = {}
        self._names: dict[int, list[str]] = {}  # id(parameter) -> its names in params.pt
        self._ctx: Any = None
        self.steps = 0
        self.info: dict[str, Any] = {}
        self.written = False

    def on_setup(
        self, ctx: Any, model: nn.Module, optimizers: Sequence[torch.optim.Optimizer]
    ) -> None:
        self.models.append(unwrap_module(model))
        # its whole state on rank 0 (the strategy's: a collective when the model is sharded)
        self.full_states.append(ctx.strategy.full_model_state)
        self._name_parameters()
        for optimizer in optimizers:
            self.optimizers.append(type(optimizer).__name__)
            optimizer.register_step_pre_hook(lambda opt, *_: self._note_gradients(opt))
            optimizer.register_step_post_hook(lambda *_: self._on_step())

    def _name_parameters(self) -> None:
        """Every parameter's names as ``params.pt`` has them (a tied one has several)."""
        self._names = {}
        several = len(self.models) > 1
        for i, model in enumerate(self.models):
            prefix = f"model{i}." if several else ""
            for name, param in model.named_parameters(remove_duplicate=False):
                self._names.setdefault(id(param), []).append(prefix + name)

    def _note_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Keep, per parameter, how small its gradient is beside those of the module that holds
        it (the largest over the steps of ``rms(its gradient) / rms(the gradients of its
        module's own parameters)``): an attention key's bias, which softmax ignores, gets a
        gradient that is rounding noise of its weight's, its values are noise, and ``verify``
        does not judge it by its relative difference. Every rank calls this (a sharded
        gradient's norm is summed over its shards: one all-reduce per mesh and axes)."""
        grads = {
            id(p): p.grad
            for group in optimizer.param_groups
            for p in group["params"]
            if p.grad is not None and id(p) in self._names
        }
        if not grads:
            return
        squares = dict(zip(grads, squared_norms(list(grads.values())), strict=True))
        members: dict[str, set[int]] = {}  # module name -> its own parameters with a gradient
        for key in grads:
            for name in self._names[key]:
                members.setdefault(name.rpartition(".")[0], set()).add(key)
        for key, grad in grads.items():
            for name in self._names[key]:
                module = members[name.rpartition(".")[0]]
                total = sum(squares[k] for k in module)
                if not (math.isfinite(total) and total > 0):  # no gradient, or an overflow
                    continue
                mean_square = total / sum(grads[k].numel() for k in module)
                ratio = math.sqrt(squares[key] / max(1, grad.numel()) / mean_square)
                self.gradient_noise[name] = max(self.gradient_noise.get(name, 0.0), ratio)

    def on_loader(self, ctx: Any, loader: Any) -> None:
        names = ("global_batch_size", "num_samples", "shuffle", "accumulation_steps", "seed")
        held = getattr(loader, "sampler", loader)  # a StreamLoader has them itself
        self.loaders.append({name: getattr(held, name, None) for name in names})

    def wrap_backward(self, ctx: Any, backward: Callable[..., None]) -> Callable[..., None]:
        self._ctx = ctx

        def recorded(loss: torch.Tensor, **kwargs: Any) -> None:
            if kwargs.get("num_items") is not None:
                self.weighted += 1
                self._weighted_pending = True  # a sum: the step's loss is ctx.step_loss
            else:
                self._pending.append(float(loss.detach().float().mean()))
                self._note_mean(loss)
            backward(loss, **kwargs)

        return recorded

    def on_teardown(self, ctx: Any) -> None:
        self.write()

    def _on_step(self) -> None:
        self._note_step()
        self.steps += 1
        if self.max_steps and self.steps >= self.max_steps:
            self.write()
            raise VerifyStop()

    def _note_mean(self, loss: torch.Tensor) -> None:
        """A mean over targets some of which are ignored: its weight per item depends on how
        many are ignored in this micro-batch (``verify`` says so if results differ)."""
        found = torch_compat.mean_over_ignored(loss)
        if found is None:
            return
        counts = self.mean_over_ignored
        counts["calls"] += 1
        counts["ignored"] += found[0]
        counts["targets"] += found[1]
        # The same share in every call (transformers' one-token label shift ignores the last
        # target of each sequence) weighs every item alike; a share that varies is padding.
        share = [found[0] // math.gcd(*found), found[1] // math.gcd(*found)]
        if "share" not in counts:
            counts["share"], counts["varies"] = share, False
        elif share != counts["share"]:
            counts["varies"] = True

    def _note_step(self) -> None:
        loss = sum(self._pending) / len(self._pending) if self._pending else None
        if self._weighted_pending and self._ctx is not None:
            loss = self._ctx.step_loss  # the same global mean per item on every rank
        self.losses.append(loss)
        self._pending, self._weighted_pending = [], False

    def write(self) -> None:
        """Write this rank's record (and rank 0's parameters) once."""
        if self.written:
            return
        self.written = True
        text = json.dumps(self.record()).encode()
        atomic_write(self.directory / self.FILE.format(rank=self.rank), lambda fh: fh.write(text))
        self._write_models()

    def record(self) -> dict[str, Any]:
        """This rank's record (see the module doc)."""
        params = next((p for m in self.models for p in m.parameters()), None)
        modules = [(name, mod) for m in self.models for name, mod in m.named_modules()]
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "steps": self.steps,
            "losses": self.losses,
            "weighted_backward": self.weighted,
            "mean_over_ignored": self.mean_over_ignored,
            "gradient_noise": self.gradient_noise,
            "loaders": self.loaders,
            "dropout": [name for name, mod in modules if isinstance(mod, _DROPOUT) and mod.p > 0],
            "batchnorm": {
                name: isinstance(mod, _SYNCED_BATCHNORM)
                for name, mod in modules
                if isinstance(mod, _BATCHNORM)
            },
            "dtype": str(params.dtype).removeprefix("torch.") if params is not None else None,
            "optimizers": self.optimizers,
            **self.info,
        }

    def _write_models(self) -> None:
        # Every rank gathers (under FSDP the whole state is a collective); rank 0 writes it.
        wholes = [full(model) for model, full in zip(self.models, self.full_states, strict=True)]
        if self.rank == 0:
            state: dict[str, torch.Tensor] = {}
            for i, whole in enumerate(wholes):
                prefix = f"model{i}." if len(self.models) > 1 else ""
                for key, value in whole.items():
                    state[prefix + key] = value.detach().cpu().clone()
            atomic_write(self.directory / "params.pt", lambda fh: torch.save(state, fh))


def squared_norms(tensors: Sequence[torch.Tensor]) -> list[float]:
    """The squared L2 norm of each whole tensor, in float64: a DTensor's local pieces are summed
    over the mesh axes it is sharded on (one all-reduce per mesh and axes, on every rank of the
    mesh), a replicated axis counted once."""
    squares: list[torch.Tensor] = []
    sharded: dict[tuple[int, tuple[int, ...]], list[int]] = {}
    for i, tensor in enumerate(tensors):
        value: Any = tensor.detach()
        if torch_compat.is_dtensor(value):
            if any(p.is_partial() for p in value.placements):
                value = value.full_tensor()
            else:
                axes = tuple(a for a, p in enumerate(value.placements) if p.is_shard())
                if axes:
                    sharded.setdefault((id(value.device_mesh), axes), []).append(i)
                value = value.to_local()
        squares.append(torch.linalg.vector_norm(value.float()).double() ** 2)
    for (_, axes), indices in sharded.items():
        mesh: Any = tensors[indices[0]].device_mesh  # type: ignore[attr-defined]
        summed = torch.stack([squares[i] for i in indices])
        for axis in axes:
            dist.all_reduce(summed, group=mesh.get_group(axis))
        for i, value in zip(indices, summed.unbind(), strict=True):
            squares[i] = value
    return [float(square) for square in squares]

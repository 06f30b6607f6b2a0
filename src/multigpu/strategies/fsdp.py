"""``fsdp``: Fully Sharded Data Parallel on FSDP2's ``fully_shard``, over a named DeviceMesh.

Each rank keeps 1/N of every parameter, gradient and optimizer state (ZeRO-3). A unit's whole
parameters are all-gathered just before its forward and backward and freed after; gradients are
reduce-scattered, so each rank steps only its shard. What multigpu adds around ``fully_shard``:
units chosen per block, with tied weights in one unit (``fsdp_units``), mixed precision from
``precision``, the optimizer re-pointed at the sharded parameters, meta-device models
materialized shard by shard with the weights a one-process run would have, accumulation without
re-sharding between micro-batches, and clipping over the sharded gradients with DDP's norm.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from multigpu.common.log import warn_once
from multigpu.common.mesh import MeshShape
from multigpu.errors import UsageError
from multigpu.runtime import tbb_malloc
from multigpu.runtime.wrappers import unwrap_module
from multigpu.strategies.activation_checkpointing import ActivationCheckpointing
from multigpu.strategies.base import Strategy, is_count
from multigpu.strategies.compose import compose
from multigpu.strategies.fsdp_ties import Unit
from multigpu.strategies.fsdp_units import DEFAULT_MIN_BLOCK_PARAMS, count_params, plan_units
from multigpu.strategies.materialize import check_initializable, has_meta_tensors, materialize
from multigpu.strategies.sync_batchnorm import convert_sync_batchnorm
from multigpu.torch_compat import (
    cpu_offload_policy,
    drop_fsdp_process_groups,
    drop_mesh_process_groups,
    fsdp_module_class,
    fully_shard,
    is_dtensor,
    mixed_precision_policy,
)

log = logging.getLogger(__name__)


class FSDPStrategy(Strategy):
    """Shard parameters, gradients and optimizer state across ranks with FSDP2.

    Args:
        blocks: module classes to shard as units of their own (e.g. ``(TransformerBlock,)``).
            None: the model's blocks — the classes it declares (Hugging Face's
            ``_no_split_modules``), else the modules repeated in a ``ModuleList``/``Sequential``
            at any depth, else its children of ``min_block_params`` or more (``fsdp_units``).
            The root module is always a unit; modules sharing a parameter share a unit.
        min_block_params: the size below which a plain layer (a repeated ``Linear``) or a child
            of a model without blocks stays in its parent's unit; blocks are units at any size.
        reshard_after_forward: False keeps each unit's gathered parameters from its forward to
            its backward (ZeRO-2-like: less communication, more memory). The root unit stays
            gathered either way, as in FSDP2, and so does the last block (as in torchtitan):
            their backward comes first.
        cpu_offload: keep the sharded state in CPU RAM and step there (``CPUOffloadPolicy``):
            GPU only, ignored with a warning on CPU processes.
        activation_checkpointing: recompute each unit's activations in the backward: False,
            True or ``"full"`` (the whole unit: least memory, about a third more compute),
            ``"selective"`` (keep the matmul and attention outputs, recompute the cheap ops),
            or a memory budget in (0, 1), the share of activations kept (needs
            ``init(compile=)``); see ``multigpu.strategies.activation_checkpointing``.
        replicate: HSDP: ranks holding whole replicas (each shards within ``world_size /
            replicate`` ranks, e.g. one node; gradients are averaged across the replicas).
        mesh_shape: the mesh as ``"replicate=2,shard=4"``, a dict or a ``MeshShape`` (instead
            of ``replicate``); None: ``MULTIGPU_MESH`` when set, else ``replicate``. A ``tp``
            axis needs a tensor-parallel plan: ``TensorParallelStrategy``.
    """

    name = "fsdp"
    handles_precision = True
    needs_process_group = True
    forward_is_collective = True

    def __init__(
        self,
        *,
        blocks: Sequence[type[nn.Module]] | None = None,
        min_block_params: int = DEFAULT_MIN_BLOCK_PARAMS,
        reshard_after_forward: bool = True,
        cpu_offload: bool = False,
        activation_checkpointing: bool | str | float | None = False,
        replicate: int = 1,
        mesh_shape: str | Mapping[str, int] | MeshShape | None = None,
    ) -> None:
        super().__init__()
        if blocks is not None and not all(
            isinstance(b, type) and issubclass(b, nn.Module) for b in blocks
        ):
            raise UsageError(
                f"FSDPStrategy(blocks={blocks!r}): expected a sequence of nn.Module classes, "
                "e.g. blocks=(TransformerBlock,)"
            )
        if not is_count(min_block_params):
            raise UsageError(
                f"FSDPStrategy(min_block_params={min_block_params!r}): expected a positive "
                "number of parameters, e.g. 100_000"
            )
        self.blocks = tuple(blocks) if blocks else None
        self.min_block_params = min_block_params
        self.reshard_after_forward = bool(reshard_after_forward)
        self.cpu_offload = bool(cpu_offload)
        policy = activation_checkpointing
        self.checkpointing = ActivationCheckpointing.parse(policy, owner=type(self).__name__)
        if mesh_shape is not None and replicate != 1:
            raise UsageError(
                f"FSDPStrategy(replicate={replicate!r}, mesh_shape={mesh_shape!r}) gives the "
                "mesh twice; give mesh_shape alone, e.g. mesh_shape='replicate=2,shard=4'"
            )
        self.shape = MeshShape(dp_replicate=replicate)
        self.shape_given = mesh_shape is not None or replicate != 1
        """False when no shape came from code: ``MULTIGPU_MESH`` may give one."""
        if mesh_shape is not None:
            self.set_mesh_shape(mesh_shape, given_as="mesh_shape")
        self._mesh: Any = None
        self._units: list[str] = []
        self._unit_rule = ""
        self._wrapped: list[weakref.ref[nn.Module]] = []
        self._kept = tbb_malloc.KeptBlocks()

    def set_mesh_shape(
        self, spec: str | Mapping[str, int] | MeshShape, *, given_as: str = "mesh_shape"
    ) -> None:
        """Use the mesh ``spec`` (checked against the world size in ``bind``); no ``tp`` axis."""
        shape = MeshShape.parse(spec, given_as=given_as)
        if shape.tp != 1:
            raise UsageError(
                f"{given_as}={spec!r} has a tp axis, but strategy='fsdp' has no tensor-parallel "
                "plan; use multigpu.TensorParallelStrategy(plan, tensor_parallel=N) (see "
                "docs/tensor-parallel.md), or drop tp"
            )
        self.shape = shape

    def validate(self) -> None:
        if self.precision.name == "16-mixed":
            raise UsageError(
                "precision='16-mixed' with strategy='fsdp': float16 needs a loss scaler over "
                "sharded gradients, which multigpu does not provide; use precision='bf16-mixed' "
                "(no scaler needed) or strategy='ddp'"
            )
        self.shape = self.shape.resolve(self.world_size)
        if self.cpu_offload and self.device.type != "cuda":
            warn_once(
                log,
                "FSDPStrategy(cpu_offload=True) ignored: offloading moves GPU memory to CPU RAM, "
                "and these processes already keep everything in CPU RAM",
            )

    @property
    def mesh(self) -> Any:
        """The ``DeviceMesh`` FSDP shards over (axis ``dp_shard``; HSDP: ``dp_replicate`` too)."""
        if self._mesh is None:
            if not dist.is_initialized():
                raise UsageError(
                    "strategy='fsdp' needs a process group; create the Context with "
                    "multigpu.init(strategy='fsdp') (it makes one even for one process)"
                )
            self._mesh = self.shape.build(self.device.type)
        return self._mesh

    def wrap(self, module: nn.Module) -> nn.Module:
        if count_params(module) == 0:
            raise UsageError(
                f"strategy='fsdp' got a model with no parameters ({type(module).__name__}); FSDP "
                "shards parameters: give the model that holds them, or use strategy='ddp'"
            )
        if isinstance(module, fsdp_module_class()):
            raise UsageError(
                f"the model ({type(module).__name__}) was already sharded with fully_shard; "
                "give ctx.setup the plain model: multigpu shards it"
            )
        if self.sync_batchnorm:
            module = convert_sync_batchnorm(module, self.device)
        meta = has_meta_tensors(module)
        if meta:
            check_initializable(module)  # before any collective or allocation
        else:
            module = module.to(self.device)
        if self.device.type == "cpu":
            # FSDP frees and makes again the same few large sizes, unit after unit.
            self._kept.keep()
        plan = plan_units(module, self.blocks, self.min_block_params)
        if plan.warning:
            warn_once(log, plan.warning)
        options = self._shard_options()

        last = plan.units[-2] if len(plan.units) > 1 else None

        def shard(unit: Unit) -> None:
            many = len(unit.modules) > 1  # modules sharing parameters: one unit for them all
            # The last block's backward comes first, right after its forward: resharding it
            # would only gather it again at once (torchtitan keeps it too). One gather a step less.
            kept = {"reshard_after_forward": False} if unit is last else {}
            fully_shard(list(unit.modules) if many else unit.modules[0], **{**options, **kept})

        # Per unit: checkpointing, then compile, then fully_shard (strategies.compose).
        self.composed = compose(
            module,
            plan.units[:-1],
            checkpointing=self.checkpointing,
            backend=self.compile,
            shard=shard,
        )
        # The root's parameters are the first the backward needs: keep them (FSDP2's default).
        options["reshard_after_forward"] = False
        if "mp_policy" in options:  # the root returns float32, as autocast would
            options["mp_policy"] = replace(options["mp_policy"], output_dtype=torch.float32)
        fully_shard(module, **options)
        if meta:
            materialize(module, self.device, checked=True)
        self._units = plan.names
        self._unit_rule = str(plan.choice)
        log.debug("fsdp units: %s", ", ".join(self._units))
        self._wrapped.append(weakref.ref(module))
        return module

    def teardown(self) -> None:
        """Drop the process groups the sharded models keep, before the groups are destroyed:
        held there, gloo's threads would live on into interpreter finalization, where one
        reaching for the GIL aborts the process. The models cannot communicate afterwards."""
        for ref in self._wrapped:
            module = ref()
            if module is not None:
                drop_fsdp_process_groups(module)
        self._wrapped.clear()
        self._kept.release()
        if self._mesh is not None:  # also held by every DTensor (parameters, optimizer state)
            drop_mesh_process_groups(self._mesh)

    def shard_mesh(self) -> Any:
        """The (sub-)mesh ``fully_shard`` shards over: the data-parallel axes."""
        return self.mesh

    def _shard_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "mesh": self.shard_mesh(),
            "reshard_after_forward": self.reshard_after_forward,
        }
        if self.precision.dtype is not None:
            # bf16 compute, float32 gradient reduction: sums of many bf16 terms lose too much.
            options["mp_policy"] = mixed_precision_policy(
                param_dtype=self.precision.dtype, reduce_dtype=torch.float32
            )
        if self.cpu_offload and self.device.type == "cuda":
            options["offload_policy"] = cpu_offload_policy()
        return options

    @contextlib.contextmanager
    def no_sync(self, module: nn.Module) -> Iterator[None]:
        """No reduce-scatter, no re-sharding between micro-batches (gradients accumulate whole)."""
        plain = unwrap_module(module)
        if not isinstance(plain, fsdp_module_class()):
            yield
            return
        sharded: Any = plain  # an FSDPModule: its methods are FSDP2's
        sharded.set_requires_gradient_sync(False)
        sharded.set_reshard_after_backward(False)
        try:
            yield
        finally:
            sharded.set_requires_gradient_sync(True)
            sharded.set_reshard_after_backward(True)

    def join(self, module: nn.Module) -> contextlib.AbstractContextManager[Any]:
        raise UsageError(
            "ctx.join is DDP's way through uneven inputs; FSDP cannot shadow the missing "
            "batches: train with ctx.loader(..., drop_last=True) (the default) instead"
        )

    def clip_grad_norm(
        self, module: nn.Module, max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        norm = torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm, norm_type=norm_type)
        # The norm over sharded gradients is a replicated DTensor: the same number as DDP's.
        return norm.full_tensor() if is_dtensor(norm) else norm  # type: ignore[attr-defined]

    def describe(self) -> dict[str, Any]:
        return {
            "strategy": self.name,
            "mesh": dict(zip(self.shape.axis_names, self.shape.sizes, strict=True))
            if self.shape.dp_shard > 0
            else None,
            "units": self._units,
            "unit_rule": self._unit_rule,
            "reshard_after_forward": self.reshard_after_forward,
            "cpu_offload": self.cpu_offload and self.device.type == "cuda",
            "activation_checkpointing": self.checkpointing.describe(),
            **self.composition(),
        }

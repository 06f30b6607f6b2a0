"""Tensor parallel on a 2-D mesh: each layer's matrices split over ``tp``, FSDP over the rest.

The recipe of torchtitan and Lightning Fabric's ``ModelParallelStrategy``, on torch's own pieces:
a named mesh ``(dp_shard, tp)`` (``(dp_replicate, dp_shard, tp)`` with HSDP),
``torch.distributed.tensor.parallel.parallelize_module`` with the user's plan (e.g.
``ColwiseParallel`` then ``RowwiseParallel``) on the ``tp`` axis, then ``fully_shard`` per block
on the data-parallel axes — FSDPStrategy's units, precision, meta-device init, accumulation,
clipping and sharded DCP state, unchanged. The ranks of one TP group compute one batch together,
so ``ctx.loader`` splits the data over the data-parallel ranks only (``data_shard``), and the
global batch stays the user's number.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from multigpu.common.mesh import MeshShape
from multigpu.common.mesh_spec import check_size
from multigpu.errors import UsageError
from multigpu.strategies.fsdp import FSDPStrategy
from multigpu.strategies.fsdp_units import DEFAULT_MIN_BLOCK_PARAMS
from multigpu.strategies.materialize import has_meta_tensors
from multigpu.torch_compat import is_dtensor, quiet_sequential_redistribution

Plan = Mapping[str, Any] | Callable[[nn.Module, Any], Any]
"""``{submodule name: ParallelStyle}`` for ``parallelize_module``, or ``fn(model, tp_mesh)``
applying the parallelism itself (its return value, if a module, replaces the model)."""


class TensorParallelStrategy(FSDPStrategy):
    """Split each planned layer over ``tensor_parallel`` ranks, shard the rest with FSDP2.

    Args:
        plan: ``{"net.0": ColwiseParallel(), "net.2": RowwiseParallel()}`` (submodule names of
            the plain model, given to ``parallelize_module`` on the ``tp`` axis), or a function
            ``fn(model, tp_mesh)`` that parallelizes the model itself.
        tensor_parallel: ranks each layer is split over (the ``tp`` axis, innermost: ranks
            ``0..tp-1`` form the first group; keep it within a node). The data-parallel axes
            take the rest of the world.
        replicate: HSDP across the data-parallel ranks (whole replicas across
            ``replicate`` groups, shards within); 1 (default): FSDP over every data-parallel rank.
        blocks, min_block_params, reshard_after_forward, cpu_offload, activation_checkpointing:
            FSDPStrategy's, for the FSDP units on the data-parallel axes. Per block, the order
            is ``parallelize_module``, activation checkpointing, ``torch.compile`` (with
            ``init(compile=)``), ``fully_shard`` (``strategies.compose``).
    """

    name = "tp"

    def __init__(
        self,
        plan: Plan,
        *,
        tensor_parallel: int,
        replicate: int = 1,
        blocks: Sequence[type[nn.Module]] | None = None,
        min_block_params: int = DEFAULT_MIN_BLOCK_PARAMS,
        reshard_after_forward: bool = True,
        cpu_offload: bool = False,
        activation_checkpointing: bool | str | float | None = False,
    ) -> None:
        super().__init__(
            blocks=blocks,
            min_block_params=min_block_params,
            reshard_after_forward=reshard_after_forward,
            cpu_offload=cpu_offload,
            activation_checkpointing=activation_checkpointing,
        )
        if not callable(plan) and not (
            isinstance(plan, Mapping) and plan and all(isinstance(k, str) for k in plan)
        ):
            raise UsageError(
                f"TensorParallelStrategy(plan={plan!r}): expected a dict of submodule names to "
                "ParallelStyles, e.g. {'net.0': ColwiseParallel(), 'net.2': RowwiseParallel()}, "
                "or a function fn(model, tp_mesh)"
            )
        check_size("tp", tensor_parallel, given_as="TensorParallelStrategy(tensor_parallel=)")
        check_size("dp_replicate", replicate, given_as="TensorParallelStrategy(replicate=)")
        self.plan = plan
        self.shape = MeshShape(dp_replicate=replicate, tp=tensor_parallel)
        self.shape_given = True  # tensor_parallel is required: the shape is the code's

    def set_mesh_shape(
        self, spec: str | Mapping[str, int] | MeshShape, *, given_as: str = "mesh_shape"
    ) -> None:
        """Use the mesh ``spec``; it must keep a ``tp`` axis (this strategy's reason to be)."""
        shape = MeshShape.parse(spec, given_as=given_as)
        if shape.tp == 1:
            raise UsageError(
                f"{given_as}={spec!r} has no tp axis for TensorParallelStrategy; add one, "
                "e.g. 'dp=2,tp=2', or use strategy='fsdp'"
            )
        self.shape = shape

    def validate(self) -> None:
        super().validate()
        if self.compile is not None and self.checkpointing.mode in ("full", "budget"):
            # Measured with torch 2.13: the compiled backward of a parallelized block saves the
            # mesh ("expected all tensors_saved_with_vc_check to be Tensors"), and the budget's
            # partitioner cannot size the process group it holds; selective compiles and trains.
            given = self.checkpointing.budget if self.checkpointing.mode == "budget" else "full"
            raise UsageError(
                f"TensorParallelStrategy(activation_checkpointing={given!r}) with compile="
                f"{self.compile!r}: torch's compiler fails on a tensor-parallel block "
                "checkpointed this way; use activation_checkpointing='selective', or compile=False"
            )

    def data_shard(self, rank: int, world_size: int) -> tuple[int, int]:
        """The data-parallel coordinate of ``rank``: a TP group reads one batch."""
        return self.shape.data_rank(rank), self.shape.data_parallel

    def shard_mesh(self) -> Any:
        """The data-parallel sub-mesh (``dp_shard``, with ``dp_replicate`` under HSDP)."""
        data_axes = tuple(a for a in self.mesh.mesh_dim_names if a != "tp")
        return self.mesh[data_axes if len(data_axes) > 1 else data_axes[0]]

    def wrap(self, module: nn.Module) -> nn.Module:
        """Parallelize ``module`` over ``tp``, then shard it over the data-parallel axes."""
        from torch.distributed.tensor.parallel import parallelize_module

        tp_mesh = self.mesh["tp"]
        if not has_meta_tensors(module):  # split on the device: parallelize_module keeps it
            module = module.to(self.device)
        if callable(self.plan):
            made = self.plan(module, tp_mesh)
            module = made if isinstance(made, nn.Module) else module
        else:
            names = dict(module.named_modules())
            missing = [name for name in self.plan if name not in names]
            if missing:
                raise UsageError(
                    f"the tensor-parallel plan names {missing}, which the model "
                    f"({type(module).__name__}) does not have; use names from "
                    f"model.named_modules(), e.g. {[n for n in names if n][:4]}"
                )
            module = parallelize_module(module, tp_mesh, dict(self.plan))
        return super().wrap(module)

    def clip_grad_norm(
        self, module: nn.Module, max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clip by the whole model's gradient norm, the number DDP gives.

        ``clip_grad_norm_`` stacks the per-parameter norms, which fails here: a TP layer's
        gradients live on the 2-D mesh, the other layers' on the data-parallel one. Each norm is
        made whole first (one small reduction per parameter), then combined.
        """
        grads = [p.grad for p in module.parameters() if p.grad is not None]
        if not grads:
            return torch.tensor(0.0)
        norms = []
        with quiet_sequential_redistribution():
            for grad in grads:
                norm = torch.linalg.vector_norm(grad, norm_type)
                norms.append(norm.full_tensor() if is_dtensor(norm) else norm)
        stacked = torch.stack(norms)
        total = (
            stacked.max() if math.isinf(norm_type) else torch.linalg.vector_norm(stacked, norm_type)
        )
        scale = min(1.0, float(max_norm / (total + 1e-6)))  # clip_grad_norm_'s coefficient
        if scale < 1.0:
            for grad in grads:
                grad.mul_(scale)
        return total

    def describe(self) -> dict[str, Any]:
        described = super().describe()
        described["plan"] = (
            getattr(self.plan, "__name__", "function")
            if callable(self.plan)
            else {name: type(style).__name__ for name, style in self.plan.items()}
        )
        return described

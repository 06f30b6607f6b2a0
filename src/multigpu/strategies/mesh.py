"""The parallel dimensions of a job, and the named ``DeviceMesh`` built from them.

A small, self-validating description in the spirit of torchtitan's ``ParallelDims``: the world
is a grid whose axes are named by what they parallelise. Data parallelism has two axes:
``dp_replicate`` (whole copies of the model, gradients all-reduced across them: DDP, or HSDP's
replicas across nodes) and ``dp_shard`` (the model's state split across ranks: FSDP). Tensor
parallelism adds ``tp`` (each layer's matrices split across ranks), innermost: its ranks are
neighbours (the GPUs of one node, where the links are fastest). The product of the sizes is the
world size. How a user spells a shape (``"dp=2,tp=2"``, ``{"replicate": 2}``) is
``multigpu.mesh_spec``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from multigpu.errors import UsageError
from multigpu.mesh_spec import AXES, check_size, parse_mesh, resolve_sizes


@dataclass(frozen=True, kw_only=True)
class MeshShape:
    """How many ranks each parallel axis spans.

    Example:
        >>> MeshShape(dp_replicate=2).resolve(8)
        MeshShape(dp_replicate=2, dp_shard=4, tp=1)
        >>> MeshShape().resolve(4).axis_names
        ('dp_shard',)
        >>> MeshShape.parse("dp=2,tp=2").resolve(4).axis_names
        ('dp_shard', 'tp')
    """

    dp_replicate: int = 1
    """Ranks holding whole replicas of the (sharded) model; gradients are averaged across them."""
    dp_shard: int = -1
    """Ranks the model's state is sharded over; -1: what the other axes leave of the world."""
    tp: int = 1
    """Ranks each tensor-parallel layer is split over (innermost: neighbouring ranks)."""

    @classmethod
    def parse(
        cls, spec: str | Mapping[str, int] | MeshShape, *, given_as: str = "mesh_shape"
    ) -> MeshShape:
        """A shape from ``"dp=2,tp=2"``, ``{"replicate": 2, "shard": 2}`` or a MeshShape.

        Raises:
            UsageError: an unknown axis or a size that is not a positive integer.
        """
        if isinstance(spec, MeshShape):
            return spec
        return cls(**parse_mesh(spec, given_as=given_as))

    def resolve(self, world_size: int) -> MeshShape:
        """This shape with ``-1`` filled in, checked against ``world_size``.

        Raises:
            UsageError: an axis is not a positive size (or -1), or the sizes do not multiply to
                the world size.
        """
        for axis in AXES:
            check_size(axis, getattr(self, axis))
        return MeshShape(**resolve_sizes(self.as_dict(), world_size))

    def as_dict(self) -> dict[str, int]:
        """``{axis: size}`` of every axis (unresolved ones as given)."""
        return {axis: getattr(self, axis) for axis in AXES}

    @property
    def axis_names(self) -> tuple[str, ...]:
        """The mesh's axis names, outermost first: ``dp_shard`` always, the others when > 1."""
        return tuple(a for a in AXES if a == "dp_shard" or getattr(self, a) > 1)

    @property
    def sizes(self) -> tuple[int, ...]:
        """The size of each axis of ``axis_names``."""
        return tuple(getattr(self, axis) for axis in self.axis_names)

    @property
    def data_parallel(self) -> int:
        """Ranks that see different data: ``dp_replicate * dp_shard`` (the TP ranks share it)."""
        return self.dp_replicate * self.dp_shard

    def data_rank(self, rank: int) -> int:
        """Which of the ``data_parallel`` data shards ``rank`` reads (TP is the innermost axis:
        ranks ``r`` and ``r + 1`` of one TP group read the same batch).

        Example:
            >>> [MeshShape(dp_shard=2, tp=2).data_rank(r) for r in range(4)]
            [0, 0, 1, 1]
        """
        return rank // self.tp

    def build(self, device_type: str) -> Any:
        """The ``DeviceMesh`` over every rank of the default process group, axes named."""
        from torch.distributed.device_mesh import init_device_mesh

        if self.dp_shard < 1:
            raise UsageError("MeshShape.build needs a resolved shape; call resolve() first")
        return init_device_mesh(device_type, self.sizes, mesh_dim_names=self.axis_names)

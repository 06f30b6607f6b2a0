"""The parallel dimensions of a job, and the named ``DeviceMesh`` built from them.

In the spirit of torchtitan's ``ParallelDims``: the world is a grid whose axes (``dp_replicate``,
``dp_shard``, ``tp``, outermost first; spelled as ``multigpu.common.mesh_spec`` says) multiply to
the world size. ``tp`` is innermost, so its ranks are neighbours (one node's GPUs, the fastest
links).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from multigpu.common.mesh_spec import AXES, parse_mesh, resolve_sizes
from multigpu.errors import UsageError


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
        """A shape from ``"dp=2,tp=2"``, ``{"replicate": 2, "shard": 2}`` or a MeshShape."""
        if isinstance(spec, MeshShape):
            return spec
        return cls(**parse_mesh(spec, given_as=given_as))

    def resolve(self, world_size: int) -> MeshShape:
        """This shape with ``-1`` filled in, checked against ``world_size`` (UsageError)."""
        return MeshShape(**resolve_sizes(asdict(self), world_size))

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
        ranks ``r`` and ``r + 1`` of one TP group read the same batch)."""
        return rank // self.tp

    def build(self, device_type: str) -> Any:
        """The ``DeviceMesh`` over every rank of the default process group, axes named."""
        from torch.distributed.device_mesh import init_device_mesh

        if self.dp_shard < 1:
            raise UsageError("MeshShape.build needs a resolved shape; call resolve() first")
        return init_device_mesh(device_type, self.sizes, mesh_dim_names=self.axis_names)

"""The parallel dimensions of a job, and the named ``DeviceMesh`` built from them.

A small, self-validating description in the spirit of torchtitan's ``ParallelDims``: the world
is a grid whose axes are named by what they parallelise. Data parallelism has two axes:
``dp_replicate`` (whole copies of the model, gradients all-reduced across them: DDP, or HSDP's
replicas across nodes) and ``dp_shard`` (the model's state split across ranks: FSDP). Their
product is the world size. Further axes (tensor, pipeline) extend the same grid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from multigpu.errors import UsageError


@dataclass(frozen=True, kw_only=True)
class MeshShape:
    """How many ranks each parallel axis spans.

    Example:
        >>> MeshShape(dp_replicate=2).resolve(8)
        MeshShape(dp_replicate=2, dp_shard=4)
        >>> MeshShape().resolve(4).axis_names
        ('dp_shard',)
    """

    dp_replicate: int = 1
    """Ranks holding whole replicas of the (sharded) model; gradients are averaged across them."""
    dp_shard: int = -1
    """Ranks the model's state is sharded over; -1: what the other axes leave of the world."""

    def resolve(self, world_size: int) -> MeshShape:
        """This shape with ``-1`` filled in, checked against ``world_size``.

        Raises:
            UsageError: an axis is not a positive size (or -1), or the sizes do not multiply to
                the world size.
        """
        for axis, size in (("dp_replicate", self.dp_replicate), ("dp_shard", self.dp_shard)):
            if isinstance(size, bool) or not isinstance(size, int) or (size < 1 and size != -1):
                raise UsageError(
                    f"mesh axis {axis}={size!r} is not a positive number of ranks; give a "
                    "positive integer (or -1 for dp_shard: the rest of the world)"
                )
        if self.dp_replicate < 1 or world_size % self.dp_replicate:
            raise UsageError(
                f"dp_replicate={self.dp_replicate} does not divide the world size {world_size}; "
                f"choose a divisor of {world_size}"
            )
        shard = world_size // self.dp_replicate if self.dp_shard == -1 else self.dp_shard
        if self.dp_replicate * shard != world_size:
            raise UsageError(
                f"dp_replicate={self.dp_replicate} x dp_shard={shard} = "
                f"{self.dp_replicate * shard} ranks, but the world size is {world_size}; make "
                "the product equal the number of processes (or leave dp_shard=-1)"
            )
        return MeshShape(dp_replicate=self.dp_replicate, dp_shard=shard)

    @property
    def axis_names(self) -> tuple[str, ...]:
        """The mesh's axis names, outermost first (``dp_replicate`` only when it is > 1)."""
        return ("dp_replicate", "dp_shard") if self.dp_replicate > 1 else ("dp_shard",)

    @property
    def sizes(self) -> tuple[int, ...]:
        """The size of each axis of ``axis_names``."""
        return (self.dp_replicate, self.dp_shard) if self.dp_replicate > 1 else (self.dp_shard,)

    def build(self, device_type: str) -> Any:
        """The ``DeviceMesh`` over every rank of the default process group, axes named."""
        from torch.distributed.device_mesh import init_device_mesh

        if self.dp_shard < 1:
            raise UsageError("MeshShape.build needs a resolved shape; call resolve() first")
        return init_device_mesh(device_type, self.sizes, mesh_dim_names=self.axis_names)

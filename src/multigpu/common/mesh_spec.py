"""A device-mesh shape as a user writes it: ``"dp=2,tp=2"``, ``"replicate=2,shard=2"``, a dict.

Torch-free, so the launcher can check ``MULTIGPU_MESH`` against the world size it plans before
any worker starts; ``multigpu.common.mesh.MeshShape`` builds on it in the workers.

Axes (canonical name first, then the other spellings accepted):

- ``dp_replicate`` (``replicate``): whole replicas of the (sharded) model, gradients averaged
  across them — HSDP's copies across nodes;
- ``dp_shard`` (``shard``, ``dp``): the ranks FSDP shards the model's state over;
- ``tp`` (``tensor``): the ranks each tensor-parallel layer's matrices are split over.

A size is a positive number of ranks, or ``-1`` for ``dp_shard`` alone: what the other axes
leave of the world (its default).
"""

from __future__ import annotations

from collections.abc import Mapping

from multigpu.errors import UsageError

AXES = ("dp_replicate", "dp_shard", "tp")
"""The canonical axis names, outermost first: the order of a built mesh's dimensions."""

ALIASES = {
    "dp_replicate": "dp_replicate",
    "replicate": "dp_replicate",
    "dp_shard": "dp_shard",
    "shard": "dp_shard",
    "dp": "dp_shard",
    "tp": "tp",
    "tensor": "tp",
}
"""Every spelling accepted for an axis, and the canonical name it means."""

EXAMPLE = "dp=2,tp=2"


def parse_mesh(spec: str | Mapping[str, int], *, given_as: str = "mesh_shape") -> dict[str, int]:
    """The canonical ``{axis: size}`` of ``spec`` (only the axes it names).

    Raises:
        UsageError: an unknown axis, one named twice, or a size that is not a positive integer
            (``-1`` is allowed for ``dp_shard``).

    Example:
        >>> parse_mesh("dp=2, tp=2")
        {'dp_shard': 2, 'tp': 2}
        >>> parse_mesh({"replicate": 2, "shard": -1})
        {'dp_replicate': 2, 'dp_shard': -1}
    """
    pairs: list[tuple[str, object]]
    if isinstance(spec, str):
        pairs = []
        for part in (p.strip() for p in spec.split(",")):
            if not part:
                continue
            name, sep, value = part.partition("=")
            if not sep:
                raise UsageError(
                    f"{given_as}={spec!r}: {part!r} is not axis=size; write e.g. {EXAMPLE!r} "
                    f"(axes: {', '.join(ALIASES)})"
                )
            pairs.append((name.strip(), _int(value.strip())))
    elif isinstance(spec, Mapping):
        pairs = list(spec.items())
    else:
        raise UsageError(
            f"{given_as}={spec!r} is a {type(spec).__name__}; expected a string like "
            f"{EXAMPLE!r} or a dict like {{'dp': 2, 'tp': 2}}"
        )
    if not pairs:
        raise UsageError(f"{given_as}={spec!r} names no axis; write e.g. {EXAMPLE!r}")
    shape: dict[str, int] = {}
    for name, size in pairs:
        axis = ALIASES.get(str(name).lower())
        if axis is None:
            raise UsageError(
                f"{given_as}={spec!r}: {name!r} is not a mesh axis; expected one of "
                f"{', '.join(ALIASES)} (e.g. {EXAMPLE!r})"
            )
        if axis in shape:
            raise UsageError(f"{given_as}={spec!r}: axis {axis} is given twice; name it once")
        shape[axis] = check_size(axis, size, given_as=given_as)
    return shape


def _int(text: str) -> object:
    try:
        return int(text)
    except ValueError:
        return text


def check_size(axis: str, size: object, *, given_as: str = "mesh_shape") -> int:
    """``size`` when it is a valid size of ``axis`` (``-1`` only for ``dp_shard``), else a
    UsageError naming the axis and the value."""
    rest = axis == "dp_shard"
    if (
        not isinstance(size, bool)
        and isinstance(size, int)
        and (size >= 1 or (rest and size == -1))
    ):
        return size
    also = " (or -1 for dp_shard: the rest of the world)" if rest else ""
    raise UsageError(
        f"{given_as}: mesh axis {axis}={size!r} is not a positive number of ranks; give a "
        f"positive integer{also}"
    )


def resolve_sizes(shape: Mapping[str, int], world_size: int) -> dict[str, int]:
    """Every axis's size for ``world_size`` ranks: ``dp_shard=-1`` (or unset) takes the rest.

    Sizes that cannot multiply to ``world_size`` are a UsageError naming the axes and the product.

    Example:
        >>> resolve_sizes({"tp": 2}, 4)
        {'dp_replicate': 1, 'dp_shard': 2, 'tp': 2}
    """
    sizes = {axis: shape.get(axis, -1 if axis == "dp_shard" else 1) for axis in AXES}
    for axis, size in sizes.items():
        check_size(axis, size)
    fixed = sizes["dp_replicate"] * sizes["tp"]
    named = " x ".join(f"{a}={sizes[a]}" for a in AXES if a != "dp_shard" and sizes[a] > 1)
    if sizes["dp_shard"] == -1:
        if world_size % fixed:
            raise UsageError(
                f"mesh {named} ({fixed} ranks) does not divide the world size {world_size}; "
                f"choose sizes whose product divides {world_size} (or run a multiple of "
                f"{fixed} processes)"
            )
        sizes["dp_shard"] = world_size // fixed
    product = fixed * sizes["dp_shard"]
    if product != world_size:
        every = " x ".join(f"{a}={sizes[a]}" for a in AXES)
        raise UsageError(
            f"mesh {every} = {product} ranks, but the world size is {world_size}; make the "
            "product equal the number of processes (or leave dp_shard=-1: the rest)"
        )
    return sizes

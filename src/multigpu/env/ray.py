"""The Ray Train source: a worker of ``ray.train.torch.TorchTrainer``.

Ray Train's torch backend starts one Ray actor per worker, gives each torchrun's position
variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``NODE_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``) and creates the default process group itself before the
training function runs; ``multigpu.init()`` then adopts that group. What tells it apart from a
torchrun worker is Ray's own mark on every process it starts (``RAY_RAYLET_PID``) with
``NODE_RANK`` and without torchrun's agent (``TORCHELASTIC_RUN_ID``: torchrun started inside a
Ray task is torchrun). Ray says nothing of the number of nodes: ``num_nodes`` is 1 when this
node holds every worker, else at least 2 (and above ``NODE_RANK``).

``MASTER_ADDR``/``MASTER_PORT`` are absent under ``TorchConfig(init_method="tcp")``.

Environment variables read: ``RAY_RAYLET_PID``, ``TORCHELASTIC_RUN_ID``, and the seven above.
"""

from __future__ import annotations

from collections.abc import Mapping

from multigpu.env._common import (
    DEFAULT_PORT,
    LOCALHOST,
    check_local_size,
    master_port,
    read_int,
    value,
)
from multigpu.env._common import build as build_env
from multigpu.env.types import ClusterEnv
from multigpu.errors import EnvError

POSITION = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK")
"""What Ray Train's torch backend sets in every worker (with ``MASTER_ADDR``/``MASTER_PORT``)."""

FIX = (
    "start the training function with ray.train.torch.TorchTrainer, which sets them, or unset "
    "RAY_RAYLET_PID to have them read as torchrun's"
)


def is_present(environ: Mapping[str, str]) -> bool:
    """True in a Ray Train worker: a process Ray started, with Ray Train's ``NODE_RANK`` and
    ``RANK``, and not a worker of a torchrun agent.

    Example:
        >>> is_present({"RAY_RAYLET_PID": "7", "NODE_RANK": "0", "RANK": "1"})
        True
        >>> is_present({"RAY_RAYLET_PID": "7", "NODE_RANK": "0", "RANK": "1",
        ...             "TORCHELASTIC_RUN_ID": "x"})
        False
    """
    return (
        value(environ, "RAY_RAYLET_PID") is not None
        and value(environ, "TORCHELASTIC_RUN_ID") is None
        and all(value(environ, n) is not None for n in ("NODE_RANK", "RANK"))
    )


def from_environ(environ: Mapping[str, str]) -> ClusterEnv | None:
    """This Ray Train worker's position; None outside one (see ``is_present``).

    Raises:
        EnvError: one of Ray Train's variables is missing or is not a valid number.

    Example:
        >>> env = from_environ({"RAY_RAYLET_PID": "7", "RANK": "1", "WORLD_SIZE": "2",
        ...     "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "0",
        ...     "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "41000"})
        >>> env.source, env.rank, env.local_rank, env.num_nodes, env.master_port
        ('ray', 1, 1, 1, 41000)
    """
    if not is_present(environ):
        return None
    missing = [n for n in POSITION if value(environ, n) is None]
    if missing:
        raise EnvError(
            f"a Ray worker (RAY_RAYLET_PID set) with Ray Train's NODE_RANK and RANK lacks "
            f"{', '.join(missing)}; expected all of {', '.join(POSITION)}, as TorchTrainer "
            f"sets them; {FIX}"
        )
    found: dict[str, tuple[str, int]] = {}
    for name, field, minimum in (
        ("RANK", "rank", 0),
        ("WORLD_SIZE", "world_size", 1),
        ("LOCAL_RANK", "local_rank", 0),
        ("LOCAL_WORLD_SIZE", "local_world_size", 1),
        ("NODE_RANK", "node_rank", 0),
    ):
        number = read_int(environ, name, minimum=minimum, fix=FIX)
        assert number is not None  # checked present above
        found[field] = number
    world, local = found["world_size"][1], found["local_world_size"][1]
    check_local_size("LOCAL_WORLD_SIZE", local, "WORLD_SIZE", world, fix=FIX)
    # Ray gives no node count: 1 when every worker is here, else a lower bound (see above).
    nodes = 1 if local == world else max(2, found["node_rank"][1] + 1)
    found["num_nodes"] = ("the nodes Ray placed workers on (at least)", nodes)
    return build_env(
        "ray",
        found,
        # Absent under TorchConfig(init_method="tcp"): the group exists already, and only the
        # hang tools' liveness ports bind there.
        master_addr=value(environ, "MASTER_ADDR") or LOCALHOST,
        master_port=master_port(environ, DEFAULT_PORT, fix=FIX),
        fix=FIX,
    )

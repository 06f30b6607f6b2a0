"""The torchrun / torchelastic / any ``env://`` launcher source.

torchrun 2.x gives every worker ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``GROUP_RANK`` (node index), ``GROUP_WORLD_SIZE`` (nodes), ``MASTER_ADDR``, ``MASTER_PORT``,
``TORCHELASTIC_RUN_ID`` and ``TORCHELASTIC_RESTART_COUNT`` (plus ``ROLE_*`` and a few others we
do not need). Hand-rolled launchers (``mp.spawn`` wrappers, ``multigpu.testing``) usually set only
the first four and ``MASTER_*``; both are accepted.

Environment variables read: the ten above, and ``TORCHELASTIC_USE_AGENT_STORE``.
"""

from __future__ import annotations

from collections.abc import Mapping

from multigpu.env._common import build, check_local_size, master_port, read_int, value
from multigpu.env.types import ClusterEnv
from multigpu.errors import EnvError

REQUIRED = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""What ``init_process_group(init_method="env://")`` needs; without any of them it cannot start."""

FIX = (
    "launch with `multigpu run` or `torchrun`, or export RANK, WORLD_SIZE, MASTER_ADDR and "
    "MASTER_PORT consistently (LOCAL_RANK and LOCAL_WORLD_SIZE too on several nodes)"
)


def is_present(environ: Mapping[str, str]) -> bool:
    """True when an ``env://`` launcher (torchrun or hand-rolled) seems to have started us.

    Example:
        >>> is_present({"RANK": "0", "WORLD_SIZE": "2"}), is_present({"LOCAL_RANK": "0"})
        (True, False)
    """
    return any(value(environ, n) is not None for n in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID"))


def is_elastic(environ: Mapping[str, str]) -> bool:
    """True when torchrun's elastic agent started us (it always sets ``TORCHELASTIC_RUN_ID``).

    The agent is then the innermost launcher (``srun torchrun``, ``mpirun torchrun``), so its
    variables win over any scheduler's without comparison.
    """
    return value(environ, "TORCHELASTIC_RUN_ID") is not None


def is_complete(environ: Mapping[str, str]) -> bool:
    """True when every variable ``env://`` needs (``REQUIRED``) is set."""
    return all(value(environ, n) is not None for n in REQUIRED)


def from_environ(environ: Mapping[str, str]) -> ClusterEnv | None:
    """Read torchrun's variables; None when no ``env://`` launcher is present.

    When ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` are both missing the job is taken to be on one
    node. ``GROUP_RANK`` / ``GROUP_WORLD_SIZE`` give the node index and count when set, else
    they are derived assuming the same number of processes on every node.

    Raises:
        EnvError: a required variable is missing, a value is not a valid number, or the numbers
            contradict each other.

    Example:
        >>> env = from_environ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h0",
        ...                     "MASTER_PORT": "29500"})
        >>> env.rank, env.local_rank, env.num_nodes
        (1, 1, 1)
    """
    if not is_present(environ):
        return None
    missing = [n for n in REQUIRED if value(environ, n) is None]
    if missing:
        given = ", ".join(f"{n}={value(environ, n)}" for n in REQUIRED if n not in missing)
        raise EnvError(
            f"torchrun-style environment is incomplete: {', '.join(missing)} not set "
            f"(given: {given or 'nothing else'}); expected all of {', '.join(REQUIRED)}; {FIX}"
        )
    rank = _int(environ, "RANK", minimum=0)
    world_size = _int(environ, "WORLD_SIZE", minimum=1)
    local = read_int(environ, "LOCAL_RANK", fix=FIX)
    local_size = read_int(environ, "LOCAL_WORLD_SIZE", minimum=1, fix=FIX)
    if local is None and local_size is None:
        # A launcher that says nothing about nodes started everything here (mp.spawn style).
        local = ("RANK (no LOCAL_RANK: one node)", rank)
        local_size = ("WORLD_SIZE (no LOCAL_WORLD_SIZE)", world_size)
    elif local is None or local_size is None:
        given = "LOCAL_WORLD_SIZE" if local is None else "LOCAL_RANK"
        absent = "LOCAL_RANK" if local is None else "LOCAL_WORLD_SIZE"
        raise EnvError(
            f"{given} is set but {absent} is not; expected both or neither (neither means one "
            f"node); {FIX}"
        )
    check_local_size(*local_size, "WORLD_SIZE", world_size, fix=FIX)
    node_rank, num_nodes = _nodes(environ, rank, world_size, local_size[1])
    fields = {
        "rank": ("RANK", rank),
        "world_size": ("WORLD_SIZE", world_size),
        "local_rank": local,
        "local_world_size": local_size,
        "node_rank": node_rank,
        "num_nodes": num_nodes,
    }
    return build(
        "torchrun",
        fields,
        master_addr=value(environ, "MASTER_ADDR") or "",
        master_port=master_port(environ, 0, fix=FIX),
        fix=FIX,
        restart_count=_int(environ, "TORCHELASTIC_RESTART_COUNT", minimum=0),
        agent_store=environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
    )


def _int(environ: Mapping[str, str], name: str, *, minimum: int) -> int:
    """``name``'s number, 0 when unset (only optional names are: REQUIRED ones were checked)."""
    found = read_int(environ, name, minimum=minimum, fix=FIX)
    return 0 if found is None else found[1]


def _nodes(
    environ: Mapping[str, str], rank: int, world_size: int, local_world_size: int
) -> tuple[tuple[str, int], tuple[str, int]]:
    """``node_rank`` and ``num_nodes``, each with its variable: from GROUP_* or derived."""
    node_rank = read_int(environ, "GROUP_RANK", fix=FIX)
    num_nodes = read_int(environ, "GROUP_WORLD_SIZE", minimum=1, fix=FIX)
    if num_nodes is None and world_size % local_world_size == 0:
        num_nodes = ("WORLD_SIZE // LOCAL_WORLD_SIZE", world_size // local_world_size)
    elif num_nodes is None:
        raise EnvError(
            f"WORLD_SIZE={world_size} is not a multiple of LOCAL_WORLD_SIZE={local_world_size} "
            f"and GROUP_WORLD_SIZE is not set; expected the same number of processes on every "
            f"node, or GROUP_RANK and GROUP_WORLD_SIZE giving the node index and count; {FIX}"
        )
    if node_rank is None:  # nodes hold consecutive blocks of ranks, as torchrun assigns them
        node_rank = ("RANK // LOCAL_WORLD_SIZE", rank // local_world_size)
    return node_rank, num_nodes

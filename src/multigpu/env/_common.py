"""Reading and checking launcher variables, shared by every source in ``multigpu.env``.

Private: the sources (torchrun, slurm, mpi, single) read through these helpers so that every
one of them treats empty values, bad integers and impossible positions the same way, and words
its errors the same way (what was given, what was expected, how to fix it).
"""

from __future__ import annotations

from collections.abc import Mapping

from multigpu.env.types import ClusterEnv, Source
from multigpu.errors import EnvError

DEFAULT_PORT = 29500
"""The port torchrun uses by default; ours too when nothing else says which."""

LOCALHOST = "127.0.0.1"


def value(environ: Mapping[str, str], name: str) -> str | None:
    """The stripped value of ``name``, or None when it is unset or blank.

    Blank counts as unset because ``export RANK=$UNDEFINED`` in a job script leaves an empty
    string behind, and that means "not given", not "given as garbage".
    """
    return environ.get(name, "").strip() or None


def first(environ: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    """``(name, value)`` of the first of ``names`` that is set (not blank), else None."""
    for name in names:
        text = value(environ, name)
        if text is not None:
            return name, text
    return None


def to_int(name: str, text: str, *, minimum: int, fix: str) -> int:
    """Parse ``name=text`` as a whole number >= ``minimum``; EnvError naming it otherwise."""
    try:
        number = int(text, 10)
    except ValueError as e:
        raise EnvError(
            f"{name}={text!r} is not an integer; expected a whole number >= {minimum}; {fix}"
        ) from e
    if number < minimum:
        raise EnvError(f"{name}={number} is out of range; expected a number >= {minimum}; {fix}")
    return number


def read_int(
    environ: Mapping[str, str], *names: str, minimum: int = 0, fix: str
) -> tuple[str, int] | None:
    """``(name, number)`` for the first of ``names`` that is set, parsed and range-checked."""
    found = first(environ, *names)
    if found is None:
        return None
    name, text = found
    return name, to_int(name, text, minimum=minimum, fix=fix)


def master_port(environ: Mapping[str, str], default: int, *, fix: str) -> int:
    """``MASTER_PORT`` (checked to be a TCP port) when set, else ``default``."""
    text = value(environ, "MASTER_PORT")
    if text is None:
        return default
    port = to_int("MASTER_PORT", text, minimum=0, fix=fix)
    check_port("MASTER_PORT", port, fix=fix)
    return port


def check_port(name: str, port: int, *, fix: str) -> None:
    """EnvError unless ``port`` is a usable TCP port (1..65535)."""
    if not 1 <= port <= 65535:
        raise EnvError(f"{name}={port} is not a TCP port; expected 1..65535; {fix}")


def check_local_size(
    local_name: str, local_world_size: int, world_name: str, world_size: int, *, fix: str
) -> None:
    """EnvError when more processes are said to be on this node than in the whole job."""
    if local_world_size > world_size:
        raise EnvError(
            f"{local_name}={local_world_size} exceeds {world_name}={world_size}; expected at "
            f"most as many processes on this node as in the whole job; {fix}"
        )


def build(
    source: Source,
    fields: Mapping[str, tuple[str, int]],
    *,
    master_addr: str,
    master_port: int,
    fix: str,
    restart_count: int = 0,
    agent_store: bool = False,
) -> ClusterEnv:
    """The ClusterEnv of ``fields`` if its numbers describe a possible job; EnvError naming the
    culprits if not. ``fields`` gives each position field's number with the variable (or
    expression) it came from: ``{"rank": ("SLURM_PROCID", 3), "node_rank": ("GROUP_RANK", 1)}``.
    """
    env = ClusterEnv(
        source=source,
        master_addr=master_addr,
        master_port=master_port,
        restart_count=restart_count,
        agent_store=agent_store,
        **{field: number for field, (_, number) in fields.items()},
    )
    names = {field: name for field, (name, _) in fields.items()}
    for low, high, what in (
        ("rank", "world_size", "a rank"),
        ("local_rank", "local_world_size", "a rank"),
        ("node_rank", "num_nodes", "a node index"),
    ):
        number, limit = getattr(env, low), getattr(env, high)
        if number >= limit:
            raise EnvError(
                f"{names[low]}={number} but {names[high]}={limit}; expected {what} in "
                f"0..{limit - 1}; {fix}"
            )
    local, world = names["local_world_size"], names["world_size"]
    check_local_size(local, env.local_world_size, world, env.world_size, fix=fix)
    if env.num_nodes > env.world_size:
        raise EnvError(
            f"{names['num_nodes']}={env.num_nodes} exceeds {world}={env.world_size}; "
            f"expected every node to run at least one process (nodes started with different "
            f"--nnodes disagree like this: give every node the same --nnodes); {fix}"
        )
    if not env.master_addr:
        raise EnvError(f"MASTER_ADDR is empty; expected a host name or IP address; {fix}")
    check_port("MASTER_PORT", env.master_port, fix=fix)
    return env

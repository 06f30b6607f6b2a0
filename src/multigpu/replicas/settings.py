"""What a worker of one replica group learns from the launcher (``multigpu run --replicas R``).

Environment variables read (all set by the launcher, one group each):
``MULTIGPU_REPLICA_GROUPS`` (R, the groups of the whole job), ``MULTIGPU_REPLICA_GROUP`` (this
group's index, 0..R-1), ``MULTIGPU_LIGHTHOUSE`` (``host:port`` of torchft's lighthouse),
``MULTIGPU_REPLICA_HOST`` (the address this group's manager server and store listen on: loopback
on one node, the cluster interface on several), ``MULTIGPU_REPLICA_HEARTBEAT_S`` (how long the
lighthouse waits for a silent group before it forms a quorum without it; the same number bounds
a step's collectives across groups), ``MULTIGPU_REPLICA_STORE`` (``host:port`` of the job's
record, a store the lighthouse's launcher hosts: ``multigpu.common.replica_record``),
``MULTIGPU_REPLICA_CHECK_EVERY`` (the groups compare their parameters every that many steps,
and after every change of quorum; default 50).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from multigpu.errors import UsageError

GROUPS_ENV = "MULTIGPU_REPLICA_GROUPS"
GROUP_ENV = "MULTIGPU_REPLICA_GROUP"
LIGHTHOUSE_ENV = "MULTIGPU_LIGHTHOUSE"
HOST_ENV = "MULTIGPU_REPLICA_HOST"
HEARTBEAT_ENV = "MULTIGPU_REPLICA_HEARTBEAT_S"
STORE_ENV = "MULTIGPU_REPLICA_STORE"
CHECK_EVERY_ENV = "MULTIGPU_REPLICA_CHECK_EVERY"
DEFAULT_CHECK_EVERY = 50
DEFAULT_HEARTBEAT_S = 2.0
"""The lighthouse's wait for a silent group: short enough for a pause of a few seconds, long
enough that a loaded machine's late heartbeat does not drop a live group."""


@dataclass(frozen=True, kw_only=True)
class ReplicaSettings:
    """This worker's place among the replica groups."""

    groups: int
    """R: the replica groups of the job; each optimizer step's global batch is cut into R shares."""
    group: int
    """This group's index, 0..R-1 (its torchft replica id is ``multigpu_group_<group>``)."""
    lighthouse: str
    """``host:port`` of the lighthouse."""
    host: str
    """The address this group's manager server and cross-group store listen on."""
    heartbeat_s: float
    """The lighthouse's heartbeat timeout (seconds)."""
    store: str | None = None
    """``host:port`` of the job's record (``multigpu.common.replica_record``); None: none (a
    group started by hand): the job's end then stays unknown to the groups."""
    check_every: int = DEFAULT_CHECK_EVERY
    """The groups compare a checksum of their parameters every that many steps (and whenever
    their quorum changes)."""


def _number(environ: Mapping[str, str], name: str, low: int) -> int:
    raw = environ.get(name, "").strip()
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if value < low:
        raise UsageError(
            f"{name}={raw!r} is not a whole number >= {low}; it is set by `multigpu run "
            "--replicas R`: start the job through it rather than setting it by hand"
        )
    return value


def read_replicas(environ: Mapping[str, str]) -> ReplicaSettings | None:
    """The replica settings of ``environ``, or None when the job runs no replica groups.

    Example:
        >>> read_replicas({}) is None
        True
        >>> read_replicas({"MULTIGPU_REPLICA_GROUPS": "2", "MULTIGPU_REPLICA_GROUP": "1",
        ...                "MULTIGPU_LIGHTHOUSE": "127.0.0.1:29510"}).group
        1
    """
    if not environ.get(GROUPS_ENV, "").strip():
        return None
    groups = _number(environ, GROUPS_ENV, 1)
    group = _number(environ, GROUP_ENV, 0)
    if group >= groups:
        raise UsageError(
            f"{GROUP_ENV}={group} is out of range for {GROUPS_ENV}={groups}; "
            f"expected 0..{groups - 1}"
        )
    lighthouse = environ.get(LIGHTHOUSE_ENV, "").strip()
    if ":" not in lighthouse:
        raise UsageError(
            f"{LIGHTHOUSE_ENV}={lighthouse!r} is not host:port; it is set by `multigpu run "
            "--replicas R` (or --lighthouse HOST:PORT)"
        )
    try:
        heartbeat = float(environ.get(HEARTBEAT_ENV, "") or DEFAULT_HEARTBEAT_S)
    except ValueError:
        heartbeat = 0.0
    if not heartbeat > 0:
        raise UsageError(f"{HEARTBEAT_ENV}={environ.get(HEARTBEAT_ENV)!r}: expected seconds > 0")
    store = environ.get(STORE_ENV, "").strip() or None
    if store is not None and ":" not in store:
        raise UsageError(
            f"{STORE_ENV}={store!r} is not host:port; it is set by `multigpu run --replicas R`"
        )
    check_every = (
        _number(environ, CHECK_EVERY_ENV, 1)
        if environ.get(CHECK_EVERY_ENV, "").strip()
        else DEFAULT_CHECK_EVERY
    )
    return ReplicaSettings(
        groups=groups,
        group=group,
        lighthouse=lighthouse,
        host=environ.get(HOST_ENV, "").strip() or "127.0.0.1",
        heartbeat_s=heartbeat,
        store=store,
        check_every=check_every,
    )


def group_directory(directory: str | Path, environ: Mapping[str, str]) -> str | Path:
    """A checkpoint directory of one replica group: ``directory/group-G`` under replica groups
    (each group saves its own: they write at the same steps), else ``directory`` itself.

    Example:
        >>> str(group_directory("ckpt", {"MULTIGPU_REPLICA_GROUPS": "2",
        ...                              "MULTIGPU_REPLICA_GROUP": "1"}))
        'ckpt/group-1'
    """
    if not environ.get(GROUPS_ENV, "").strip():
        return directory
    return Path(directory) / f"group-{_number(environ, GROUP_ENV, 0)}"

"""``--replicas R``: R replica groups of one job, each its own launcher, agent and process group.

The launcher (this process) checks the options, starts torchft's lighthouse where it belongs
and then one child launcher per group on this node (``python -m multigpu run|train`` with the
same options less ours), each with the replica variables (``multigpu.replicas.settings``) in its
environment; a child's torchrun agent restarts its group's workers (``--max-restarts``, default
3 here) while the other groups keep training. Every child dies with this process
(``PR_SET_PDEATHSIG``); the exit code is the first failing group's, 0 when every group ended well.

- One node: ``--replicas R`` starts R groups and a lighthouse on ``127.0.0.1`` (a free port).
- Several nodes: every node gives ``--lighthouse HOST:PORT`` and ``--replica-group G`` (the
  groups it starts; ``--replicas`` counts the groups of the whole job). The node whose address
  HOST is starts the lighthouse there, on that address only — never on every interface, which
  torchft's own command does by default.

Environment variables set for the children: ``MULTIGPU_REPLICA_GROUPS``,
``MULTIGPU_REPLICA_GROUP``, ``MULTIGPU_LIGHTHOUSE``, ``MULTIGPU_REPLICA_HOST``,
``PET_MAX_RESTARTS`` (unless set), ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` (unless set: the
cores shared by every worker of this node's groups), ``RUST_LOG`` (``warn`` unless set:
torchft's servers log every quorum at ``info``). Read: ``MULTIGPU_REPLICA_HEARTBEAT_S`` (passed on).
"""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from multigpu.common.host import local_addresses
from multigpu.errors import UsageError
from multigpu.launch.failure_summary import say
from multigpu.launch.worker_guard import die_with_parent

DEFAULT_RESTARTS = "3"
OUR_FLAGS = ("--replicas", "--lighthouse", "--replica-group")
HEARTBEAT_ENV = "MULTIGPU_REPLICA_HEARTBEAT_S"


@dataclass(frozen=True, kw_only=True)
class ReplicaPlan:
    """The groups this node starts and where their lighthouse is."""

    groups: int
    """R: replica groups of the whole job."""
    here: tuple[int, ...]
    """The groups started on this node."""
    lighthouse: tuple[str, int] | None
    """``--lighthouse`` as (host, port); None: a lighthouse of this node's on loopback."""


def parse_lighthouse(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) -> (host, port); UsageError otherwise.

    Example:
        >>> parse_lighthouse("10.0.0.1:29510")
        ('10.0.0.1', 29510)
    """
    host, _, port = text.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(
            f"--lighthouse {text!r} is not HOST:PORT; expected the address of the node that "
            "hosts the lighthouse and a free port on it, e.g. --lighthouse 10.0.0.1:29510"
        )
    return host, int(port)


def plan_replicas(
    replicas: int | None, lighthouse: str | None, replica_group: str | None
) -> ReplicaPlan:
    """Check ``--replicas/--lighthouse/--replica-group`` together; UsageError (exit 2) else."""
    groups = 1 if replicas is None else replicas
    if groups < 1:
        raise UsageError(f"--replicas {groups}: expected a number of replica groups >= 1")
    where = parse_lighthouse(lighthouse) if lighthouse is not None else None
    if replica_group is None:
        here = tuple(range(groups))
    else:
        try:
            here = tuple(sorted({int(g) for g in replica_group.split(",")}))
        except ValueError:
            here = (-1,)
        if not here or min(here) < 0 or max(here) >= groups:
            raise UsageError(
                f"--replica-group {replica_group!r}: expected group indices 0..{groups - 1} "
                f"(of --replicas {groups}), comma-separated, e.g. --replica-group 1"
            )
        if where is None:
            raise UsageError(
                "--replica-group is for a job on several nodes, whose groups meet at one "
                "lighthouse: give --lighthouse HOST:PORT on every node too"
            )
    return ReplicaPlan(groups=groups, here=here, lighthouse=where)


def strip_our_flags(argv: Sequence[str]) -> list[str]:
    """``argv`` less ``--replicas/--lighthouse/--replica-group`` and their values."""
    out: list[str] = []
    skip = False
    for token in argv:
        if skip:
            skip = False
            continue
        name = token.split("=", 1)[0]
        if name in OUR_FLAGS:
            skip = "=" not in token
            continue
        out.append(token)
    return out


def group_outputs(argv: Sequence[str], group: int) -> list[str]:
    """A built-in job's ``--out`` made the group's own (``DIR/group-G``): the groups write their
    logs and models apart (their checkpoints go to ``CHECKPOINT_DIR/group-G`` by themselves:
    ``multigpu.replicas.settings.group_directory``)."""
    out: list[str] = []
    follows = False
    for token in argv:
        name, eq, value = token.partition("=")
        if follows:
            token, follows = f"{token}/group-{group}", False
        elif name == "--out":
            if eq:
                token = f"{name}={value}/group-{group}"
            else:
                follows = True
        out.append(token)
    return out


def check_iface(plan: ReplicaPlan, iface: str | None) -> None:
    """Groups on several nodes meet over the cluster interface, which ``--iface`` names: without
    it a one-node group's gloo would use loopback (``GLOO_SOCKET_IFNAME=lo``), out of reach."""
    if plan.lighthouse is None or iface is not None:
        return
    host = plan.lighthouse[0]
    loopback = host == "localhost" or _is_loopback(host)
    if not loopback:
        raise UsageError(
            f"--lighthouse {host}:{plan.lighthouse[1]} without --iface: the replica groups of "
            "several nodes reach each other over the cluster interface; give --iface NAME (the "
            "interface with this node's address on that network, e.g. --iface eth0)"
        )


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: loopback when it resolves here to loopback only
        found = local_addresses(host)
        return bool(found) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in found)


def check_no_rendezvous(torchrun: Any, plan: ReplicaPlan) -> None:
    """Several groups on one node each need their own rendezvous: refuse one given for all."""
    given = [f"--{d.replace('_', '-')}" for d in ("rdzv_endpoint", "master_port") if d in torchrun]
    if given and len(plan.here) > 1:
        raise UsageError(
            f"{' '.join(given)} with {len(plan.here)} replica groups on this node: each group "
            "takes its own free port; leave the rendezvous options out (one group per node "
            "with --replica-group may keep them)"
        )


def _outward_address(host: str, port: int) -> str:
    """This machine's address on the way to ``host`` (what the other nodes reach us at)."""
    local = local_addresses(host)
    if local:
        return local[0]
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, port))  # no packet is sent: only the route is looked up
        return str(s.getsockname()[0])


def start_lighthouse(plan: ReplicaPlan) -> tuple[Any, str, str]:
    """(the lighthouse server or None, its ``host:port``, the groups' listen address here)."""
    if plan.lighthouse is None:
        host, port = "127.0.0.1", 0
    else:
        host, port = plan.lighthouse
    ours = plan.lighthouse is None or bool(local_addresses(host))
    replica_host = _outward_address(host, port or 1)
    server = None
    if ours:
        # torchft's servers log every quorum at info; its logger reads this process's
        # environment when torchft is imported (the children get the same default in theirs).
        os.environ.setdefault("RUST_LOG", "warn")
        try:
            from torchft.coordination import LighthouseServer
        except ImportError as e:
            raise UsageError(
                f"--replicas needs torchft, which is not installed ({e}); install it with: "
                "pip install 'multigpu[ft]'"
            ) from e
        at = local_addresses(host)[0] if plan.lighthouse is not None else host  # an address
        bind = f"[{at}]:{port}" if ":" in at else f"{at}:{port}"
        heartbeat_ms = int(1000 * float(os.environ.get(HEARTBEAT_ENV) or 2.0))
        try:
            server = LighthouseServer(
                bind=bind, min_replicas=1, join_timeout_ms=10_000,
                heartbeat_timeout_ms=heartbeat_ms,
            )  # fmt: skip
        except Exception as e:  # torchft raises a plain RuntimeError for a taken port
            raise UsageError(
                f"the lighthouse cannot listen on {bind} ({e}); choose a free port on this "
                "node's address for --lighthouse"
            ) from e
        port = int(str(server.address()).rsplit(":", 1)[1].strip("/"))
    return server, f"{host}:{port}", replica_host


def run_groups(command: str, argv: Sequence[str], plan: ReplicaPlan, *, threads: int) -> int:
    """Start the lighthouse (where it is ours) and this node's groups; wait for every group.
    ``threads``: each worker's ``OMP_NUM_THREADS`` (unless set): the groups share the cores."""
    server, lighthouse, replica_host = start_lighthouse(plan)
    say(
        f"{len(plan.here)} replica group(s) ({', '.join(map(str, plan.here))} of {plan.groups}); "
        f"lighthouse {lighthouse}" + (" (started here)" if server is not None else "")
    )
    child_argv = [sys.executable, "-m", "multigpu", command, *strip_our_flags(argv)]
    train = command == "train"
    children: list[tuple[int, subprocess.Popen[bytes]]] = []
    base = dict(os.environ)
    base.setdefault("PET_MAX_RESTARTS", DEFAULT_RESTARTS)
    base.setdefault("RUST_LOG", "warn")
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        base.setdefault(name, str(threads))
    for group in plan.here:
        env = base | {
            "MULTIGPU_REPLICA_GROUPS": str(plan.groups),
            "MULTIGPU_REPLICA_GROUP": str(group),
            "MULTIGPU_LIGHTHOUSE": lighthouse,
            "MULTIGPU_REPLICA_HOST": replica_host,
        }
        args = group_outputs(child_argv, group) if train else child_argv
        children.append((group, subprocess.Popen(args, env=env, preexec_fn=die_with_parent)))
    return _wait(children, server)


def _wait(children: list[tuple[int, subprocess.Popen[bytes]]], server: Any) -> int:
    def forward(signum: int, _frame: Any) -> None:
        for _, child in children:
            if child.poll() is None:
                child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        codes: dict[int, int] = {}
        while len(codes) < len(children):
            for group, child in children:
                if group not in codes and child.poll() is not None:
                    codes[group] = child.returncode
                    if child.returncode:
                        say(f"replica group {group} ended with exit code {child.returncode}")
            time.sleep(0.1)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if server is not None:
            server.shutdown()
    failed = [code for _, code in sorted(codes.items()) if code]
    return failed[0] if failed else 0

"""``--replicas R``: R replica groups of one job, each its own launcher, agent and process group.

The launcher's side (starting the groups); what a worker of a group does is ``multigpu.replicas``.

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
  torchft's own command does by default. A group is one node's: ``--nnodes`` above 1 is refused.
- The job's record (``multigpu.common.replica_record``: its end, its lives, its counts) is a
  store beside the lighthouse, on the same address: a free port on one node, ``PORT + 1`` of
  ``--lighthouse`` on several. The launcher that hosts it prints the job's summary at the end.

Environment variables set for the children: ``MULTIGPU_REPLICA_GROUPS``,
``MULTIGPU_REPLICA_GROUP``, ``MULTIGPU_LIGHTHOUSE``, ``MULTIGPU_REPLICA_HOST``,
``MULTIGPU_REPLICA_STORE``, ``PET_MAX_RESTARTS`` (unless set), ``OMP_NUM_THREADS`` /
``MKL_NUM_THREADS`` (unless set: the cores shared by every worker of this node's groups),
``TORCH_CPP_LOG_LEVEL`` (``ERROR`` unless set: a group that loses a peer's store or the job's
record would print torch's C++ warning with a 20-frame stack for each call; the group's own line
says it), ``RUST_LOG`` (``error`` unless set: torchft's servers log every quorum at ``info``;
its logger takes a level name only, and ``off`` is not one). Read:
``MULTIGPU_REPLICA_HEARTBEAT_S`` (passed on).
"""

from __future__ import annotations

import contextlib
import importlib.util
import ipaddress
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from multigpu.common.host import local_addresses
from multigpu.common.replica_record import JobRecord, job_summary
from multigpu.errors import UsageError
from multigpu.launch.engine_topology import engine_nodes
from multigpu.launch.failure_summary import say
from multigpu.launch.replica_output import GroupOutput, ending_line
from multigpu.launch.worker_guard import die_with_parent

log = logging.getLogger(__name__)

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


def check_one_node_per_group(torchrun: Any, environ: Mapping[str, str] | None = None) -> None:
    """A replica group runs on one node: its workers' store and gloo stay on that node, and the
    groups of several nodes meet through ``--lighthouse``. ``environ``: where an engine's
    variables (``PET_NNODES``, ``SKYPILOT_NUM_NODES``) name several nodes, every group would
    join that job instead."""
    named = engine_nodes(environ or {})
    if named is not None and "nnodes" not in torchrun:
        raise UsageError(
            f"--replicas under {named} (an engine's job of several nodes): a replica group runs "
            f"on one node, and every group would join that job; leave --replicas out, or start "
            f"one group per node with --replica-group G --lighthouse HOST:PORT and the engine's "
            f"variables unset (env -u {named.split('=')[0]} ...; docs/fault-tolerance.md)"
        )
    nnodes = str(torchrun.get("nnodes", "1"))
    if nnodes not in ("1", "1:1"):
        raise UsageError(
            f"--nnodes {nnodes} with --replicas: a replica group runs on one node; to train on "
            "several nodes start one group per node with --replica-group G --lighthouse "
            "HOST:PORT --iface NAME on each (docs/fault-tolerance.md), or leave --replicas out"
        )


def check_torchft() -> None:
    """Every node's groups need torchft (not only the lighthouse's node): refuse before any
    group starts, rather than fail in each worker and restart. Found, not imported: its logger
    reads ``RUST_LOG`` when it is first imported (``start_lighthouse`` sets it before)."""
    if importlib.util.find_spec("torchft") is None:
        raise UsageError(
            "--replicas needs torchft, which is not installed here; install it with: "
            "pip install 'multigpu[ft]'"
        )


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
    """(the lighthouse server or None, its ``host:port``, the groups' listen address here).
    Where the lighthouse is ours, the job's record is made beside it (``host_record``)."""
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
        os.environ.setdefault("RUST_LOG", "error")
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


def host_record(lighthouse: str, plan: ReplicaPlan) -> tuple[Any, str]:
    """The job's record, hosted here beside the lighthouse ``host:port``: (its store, its
    ``host:port``) — a free port on one node, the lighthouse's port + 1 on several (the other
    nodes' launchers find it there)."""
    from torch.distributed import TCPStore

    from multigpu.common.store_listen import listening_store

    host, _, port = lighthouse.rpartition(":")
    host = host.strip("[]")
    wanted = 0 if plan.lighthouse is None else int(port) + 1
    try:
        store = listening_store(
            TCPStore, host_name=host, port=wanted, is_master=True, wait_for_workers=False,
            many_nodes=plan.lighthouse is not None and not _is_loopback(host),
        )  # fmt: skip
    except Exception as e:  # a taken port: torch's RuntimeError, or our socket's OSError
        raise UsageError(
            f"the replica groups' record cannot listen on {host}:{wanted} ({e}); it takes the "
            "port after --lighthouse's: choose a lighthouse port whose next one is free too"
        ) from e
    address = f"[{host}]" if ":" in host else host
    return store, f"{address}:{int(store.port)}"


def record_address(lighthouse: tuple[str, int]) -> str:
    """Where another node's launcher finds the record: the lighthouse's port + 1."""
    host, port = lighthouse
    return f"[{host}]:{port + 1}" if ":" in host else f"{host}:{port + 1}"


def run_groups(
    command: str, argv: Sequence[str], plan: ReplicaPlan, *, threads: int, timeout_s: float
) -> int:
    """Start the lighthouse and the job's record (where they are ours) and this node's groups;
    wait for every group. ``threads``: each worker's ``OMP_NUM_THREADS`` (unless set): the
    groups share the cores. The launcher that hosts the lighthouse and the record keeps them
    until every group of the job ended (the other nodes' launchers say when theirs did), up to
    ``timeout_s`` (``--timeout``): a group still on its last step learns the job's end there."""
    check_torchft()
    server, lighthouse, replica_host = start_lighthouse(plan)
    hosted: Any = None
    try:
        if server is not None:
            hosted, address = host_record(lighthouse, plan)
        else:
            assert plan.lighthouse is not None  # no lighthouse of ours: --lighthouse names it
            address = record_address(plan.lighthouse)
    except BaseException:
        if server is not None:
            server.shutdown()
        raise
    log.debug(
        "%d replica group(s) (%s of %d); lighthouse %s%s", len(plan.here),
        ", ".join(map(str, plan.here)), plan.groups, lighthouse,
        " (started here)" if server is not None else "",
    )  # fmt: skip
    child_argv = [sys.executable, "-m", "multigpu", command, *strip_our_flags(argv)]
    children: list[tuple[int, subprocess.Popen[bytes]]] = []
    output = GroupOutput()
    base = dict(os.environ)
    base.setdefault("PET_MAX_RESTARTS", DEFAULT_RESTARTS)
    base.setdefault("RUST_LOG", "error")
    base.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        base.setdefault(name, str(threads))
    for group in plan.here:
        env = base | {
            "MULTIGPU_REPLICA_GROUPS": str(plan.groups),
            "MULTIGPU_REPLICA_GROUP": str(group),
            "MULTIGPU_LIGHTHOUSE": lighthouse,
            "MULTIGPU_REPLICA_HOST": replica_host,
            "MULTIGPU_REPLICA_STORE": address,
        }
        child = subprocess.Popen(
            child_argv, env=env, preexec_fn=die_with_parent, stderr=subprocess.PIPE
        )
        assert child.stderr is not None
        output.follow(group, child.stderr)
        children.append((group, child))
    record = JobRecord(hosted) if hosted is not None else _record_client(address)
    try:
        codes = _wait(children, record)
        if hosted is not None:
            _until_every_group_ended(record, plan.groups, timeout_s)
    finally:
        if server is not None:
            server.shutdown()
    # The job's summary (where a step was taken), then its ending (a failed run's last line).
    if hosted is not None and any(record.counts(g)["steps"] for g in range(plan.groups)):
        say(job_summary(record, plan.groups))
    endings = output.endings()
    said = {g for _, groups in endings for g in groups}
    for line, groups in endings:
        sys.stderr.write(ending_line(line, groups, len(plan.here)) + "\n")
    for group, code in sorted(codes.items()):
        if code and group not in said:
            say(f"replica group {group} ended with exit code {code}")
    sys.stderr.flush()
    failed = [code for _, code in sorted(codes.items()) if code]
    return failed[0] if failed else 0


def _record_client(address: str) -> JobRecord:
    """Another node's launcher: a client of the record (None-backed when it cannot be
    reached: the groups then find out by themselves, and say so)."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    host, _, port = address.rpartition(":")
    try:
        return JobRecord(
            TCPStore(host.strip("[]"), int(port), is_master=False, wait_for_workers=False,
                     timeout=timedelta(seconds=30))
        )  # fmt: skip
    except Exception:
        return JobRecord(None)


QUIET_S = 30.0
"""A group that has not looked at the job's record for this long is taken for gone (its node
died with its launcher, which could not say so)."""


def _until_every_group_ended(record: JobRecord, groups: int, timeout_s: float) -> None:
    """Keep the lighthouse and the record (this process's) until every group's launcher ended
    or the groups left stopped looking at the record for ``QUIET_S``, at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last, quiet_since = None, time.monotonic()
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            running = [g for g in range(groups) if not record.exited(g)]
            if not running:
                return
            looks = record.looks(groups)
            if looks != last:
                last, quiet_since = looks, time.monotonic()
            elif time.monotonic() - quiet_since > QUIET_S:
                return
        time.sleep(0.2)


def _wait(children: list[tuple[int, subprocess.Popen[bytes]]], record: JobRecord) -> dict[int, int]:
    """Every group's exit code, once all ended (signals passed on to them meanwhile)."""

    def forward(signum: int, _frame: Any) -> None:
        for _, child in children:
            if child.poll() is None:
                child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    codes: dict[int, int] = {}
    try:
        while len(codes) < len(children):
            for group, child in children:
                if group not in codes and child.poll() is not None:
                    codes[group] = child.returncode
                    # None of its lives comes back: a group waiting for it stops waiting.
                    with contextlib.suppress(Exception):
                        record.mark_exited(group, child.returncode)
            time.sleep(0.1)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return codes

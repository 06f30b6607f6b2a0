"""Which ranks still answer: after a collective fails, name the rank (and host) that is lost.

A collective that times out says only that (gloo: "Timed out waiting 10000ms for recv operation
to complete"), not which rank is missing. So every rank opens, at start-up, a listening TCP
socket that nothing ever reads: the kernel completes a connection to it for as long as the
process lives, with no thread and no traffic. The ranks exchange (host, address, port) once, in
``multigpu.init``. When a collective fails, the rank tries to connect to every other rank for
a few seconds, all at once, and prints one line that says, per rank, what it found:

- connected: its process is alive and reachable — not the one lost;
- refused: its host answers but nothing listens — its process has ended;
- no answer: its host is unreachable from here (network cut, host down, or a firewall).

Each rank sees only its own side: after a link cut both sides call the other unreachable, and
the launcher output of every node says which node it lost.

The address advertised is the one facing the job's master address (``ClusterEnv.master_addr``).
"""

from __future__ import annotations

import logging
import socket
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TextIO

from multigpu.common import worker_error

log = logging.getLogger(__name__)

PROBE_S = 2.0
"""How long a probe waits for a connection before it calls the peer unreachable."""

_FAILURE_WORDS = ("gloo", "nccl", "timed out", "connection closed", "connection reset")


@dataclass(frozen=True)
class Peer:
    """Where one rank listens: its hostname, the address others reach it at, and a port."""

    host: str
    address: str
    port: int


_peers: list[Peer] = []
_rank = 0
_listener: socket.socket | None = None


def _facing_address(master_addr: str | None) -> str:
    # A UDP "connect" sends nothing; it only asks the kernel which local address would be
    # used to reach the master: the address of the network the job runs on.
    # The master's name may not resolve here: then no address is better than a wrong one.
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.connect((master_addr or socket.gethostname(), 9))
            return str(udp.getsockname()[0])
    except OSError:
        return ""


def start(rank: int, gather: Callable[[Any], list[Any]], master_addr: str) -> None:
    """Open this rank's liveness port and learn every rank's (``gather``: one all-gather)."""
    global _listener, _peers, _rank
    address, host = _facing_address(master_addr), socket.gethostname()
    try:
        # Only on the address the job's network reaches (loopback on one node): nothing of a
        # run listens beyond it.
        listener = socket.create_server((address or "127.0.0.1", 0), backlog=64)
        mine = (host, address, listener.getsockname()[1])
    except OSError as e:
        log.debug("no liveness port: %s", e)
        listener, mine = None, (host, "", 0)
    # Kept open until the process exits: a peer probing us then still finds us alive.
    _listener, _rank = listener, rank
    _peers = [Peer(*p) for p in gather(mine)]


def is_collective_failure(error: BaseException) -> bool:
    """True for errors of a collective (timeout, lost connection), gloo's or NCCL's.

    Example:
        >>> is_collective_failure(RuntimeError("[gloo] Timed out waiting 10000ms for recv"))
        True
    """
    try:
        import torch.distributed as dist

        if isinstance(error, dist.DistError):
            return True
    except (ImportError, AttributeError):
        pass
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(w in text for w in _FAILURE_WORDS)


def _probe_one(peer: Peer, timeout_s: float) -> str:
    if not peer.port or not peer.address:
        return "unknown (it has no liveness port)"
    try:
        with socket.create_connection((peer.address, peer.port), timeout=timeout_s):
            return "answers"
    except ConnectionRefusedError:
        return "its process has ended (its host answers, nothing listens)"
    except OSError as e:  # timeout, no route, host unreachable
        reason = "no answer" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        return (
            f"unreachable from here ({reason} within {timeout_s:g} s: network cut, host down "
            "or firewall)"
        )


def ask_peers(timeout_s: float = PROBE_S) -> dict[int, str]:
    """What each other rank's liveness port says, probed in parallel: rank → finding."""
    others = {r: p for r, p in enumerate(_peers) if r != _rank}
    with ThreadPoolExecutor(max_workers=max(1, len(others))) as pool:
        findings = pool.map(lambda peer: _probe_one(peer, timeout_s), others.values())
        return dict(zip(others, findings, strict=True))


def lost_peers_line(
    error: BaseException, found: dict[int, str], table: list[Peer], rank: int
) -> str:
    """The one line printed by ``rank`` after a failed collective (``table``: every rank).

    Example:
        >>> table = [Peer("n0", "10.0.0.1", 1), Peer("n1", "10.0.0.2", 2)]
        >>> print(lost_peers_line(RuntimeError("Timed out"), {1: "unreachable"}, table, 0))
        multigpu: rank 0 (n0): a collective failed (Timed out); rank 1 (n1, 10.0.0.2): unreachable
    """
    me = table[rank].host if rank < len(table) else socket.gethostname()
    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    first = first.split("] ", 1)[-1]  # gloo's "[path/to/file.cc:78] " prefix
    lost = {r: f for r, f in sorted(found.items()) if f != "answers"}
    if lost:
        said = "; ".join(
            f"rank {r} ({table[r].host}, {table[r].address}): {f}" for r, f in lost.items()
        )
    else:
        said = "every other rank answers: the rank that failed first holds the cause"
    return f"multigpu: rank {rank} ({me}): a collective failed ({first}); {said}"


def report_lost_peers(error: object, stream: TextIO | None = None) -> None:
    """After ``error`` ended a script: if a collective failed, say which ranks still answer."""
    if not _peers or not isinstance(error, BaseException) or not is_collective_failure(error):
        return
    try:
        found = ask_peers()
        line = lost_peers_line(error, found, _peers, _rank)
    except Exception as e:  # a diagnosis must never hide the error it explains
        log.debug("peer probe failed: %s", e)
        return
    if all(f == "answers" for f in found.values()) and worker_error.launched_by_multigpu():
        # No rank is lost: the rank that failed first holds the cause, and the launcher's last
        # line names it (a tracker's full disk on rank 0: this line came first, the cause second).
        return
    print(line, file=stream or sys.stderr, flush=True)

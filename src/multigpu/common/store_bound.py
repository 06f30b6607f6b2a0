"""A bound on a torch store's connections: the kernel's ``TCP_USER_TIMEOUT``.

When the host of a ``TCPStore`` vanishes (link cut, power loss), a call of torch 2.13's client
waits for an answer until the kernel gives up on the connection — about 15 minutes — whatever
the store's own timeout says, deaf to SIGTERM in native code. A kernel ``TCP_USER_TIMEOUT`` on
the store's connections makes such a call fail after that many seconds instead. It never cuts a
healthy connection: it only counts data that the other side has not acknowledged.

Used by the launcher's agent (its rendezvous stores, ``multigpu.launch.timeouts``) and by a
replica group's workers (the job's record, ``multigpu.replicas.hook``). No torch import: the
store's maker is handed in.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)


def store_call_bound(make: Callable[..., Any], timeout_s: float) -> Callable[..., Any]:
    """``make`` (what builds ``TCPStore`` servers and clients), with the kernel's
    ``TCP_USER_TIMEOUT`` of ``timeout_s`` set on the TCP connections each store opens.

    Set where the stores are made (every store connection of the agent — its rendezvous
    backend's client, and the stores it hosts — is built through ``store_servers_made_by``).
    torch's ``TCPStore`` connects in its C++ constructor and gives no descriptor back, so the
    sockets it opened are those ``/proc/self/fd`` lists after the call and not before. A
    ``make`` unchanged where Linux's option (or ``/proc``) does not exist.
    """
    if not hasattr(socket, "TCP_USER_TIMEOUT") or not os.path.isdir("/proc/self/fd"):
        return make
    millis = int(timeout_s * 1000)

    def bounded(*args: Any, **kwargs: Any) -> Any:
        before = set(_sockets().values())
        store = make(*args, **kwargs)
        for fd, target in _sockets().items():
            if target not in before:
                _bound(fd, millis)
        return store

    return bounded


def _sockets() -> dict[int, str]:
    """This process's open sockets: descriptor → ``socket:[inode]``."""
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile (or the listing's own fd)
        if target.startswith("socket:"):
            found[int(fd)] = target
    return found


def _bound(fd: int, millis: int) -> bool:
    """Set ``TCP_USER_TIMEOUT`` on ``fd`` when it is a TCP socket; True when set."""
    try:
        # A duplicate of the descriptor: closing it leaves torch's socket open.
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return False
    with sock:
        if sock.type != socket.SOCK_STREAM or sock.family not in (
            socket.AF_INET,
            socket.AF_INET6,
        ):
            return False
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, millis)
        except OSError as e:  # never let the bound take the launcher down
            logger.debug("store call bound: %s", e)
            return False
    return True

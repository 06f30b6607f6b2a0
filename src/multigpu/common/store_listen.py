"""Where a store server listens: the address its clients dial, never every interface.

torch's ``TCPStore`` server binds every interface (``[::]``), and the store has no
authentication: on a machine with a public address anyone could read and write a job's keys.
multigpu binds the socket itself, on the one address the clients dial, and hands it to the
store as ``master_listen_fd``:

- the address ``host`` names, when it is one of this machine's (loopback on one node: the
  launcher advertises 127.0.0.1 there; the cluster interface's address on several nodes);
- on several nodes, a ``host`` that resolves here only to loopback (the hostname →
  127.0.1.1 of many Linux installations) says nothing of the interface the other nodes come
  in on: then the store keeps torch's every-interface binding and a warning says how to
  choose one (``--iface``).

The stores made through ``listening_store`` are the launcher's (the c10d and static rendezvous
stores, the store it shares with its workers) and rank 0's when the workers host their own
(``multigpu.runtime.dist``); ``multigpu.torch_compat.store_servers_made_by`` points torch at it.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import socket
from typing import Any

from multigpu.common.host import local_addresses

log = logging.getLogger(__name__)


def listen_address(host: str, *, many_nodes: bool) -> str | None:
    """The one address a store server for clients dialling ``host`` should listen on.

    None: keep torch's every-interface binding (``host`` is not this machine's, or on several
    nodes it resolves here only to loopback, so the other nodes' way in is unknown).

    Example:
        >>> listen_address("localhost", many_nodes=False)
        '127.0.0.1'
        >>> listen_address("localhost", many_nodes=True) is None
        True
    """
    local = local_addresses(host)
    loopback = [a for a in local if ipaddress.ip_address(a.split("%")[0]).is_loopback]
    outside = [a for a in local if a not in loopback]
    if many_nodes:
        return outside[0] if outside else None
    # IPv4 first: clients resolving "localhost" try 127.0.0.1 whatever the order.
    loopback.sort(key=lambda a: ":" in a)
    return (loopback or outside)[0] if local else None


def _listening_socket(address: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # As torch's own server does: a port in TIME_WAIT from a run that just ended is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock


_TCPSTORE_PARAMETERS = (
    "host_name", "port", "world_size", "is_master", "timeout", "wait_for_workers",
    "multi_tenant", "master_listen_fd", "use_libuv",
)  # fmt: skip
"""``TCPStore``'s parameters in their positional order."""


def listening_store(make_store: Any, *args: Any, many_nodes: bool, **kwargs: Any) -> Any:
    """``make_store(*args, **kwargs)`` (torch's ``TCPStore`` and its arguments, passed in: this
    module imports no torch), its server bound to ``listen_address(host_name)`` when
    ``is_master`` is true.

    A port this process's own multi-tenant server already holds, or an address that cannot be
    bound, is left to torch: it reuses its server, or raises its own error.
    """
    given = dict(zip(_TCPSTORE_PARAMETERS, args, strict=False)) | kwargs
    if not given.get("is_master") or given.get("master_listen_fd") is not None:
        return make_store(**given)
    host, port = str(given["host_name"]), int(given["port"])
    address = listen_address(host, many_nodes=many_nodes)
    if address is None:
        log.warning(
            "multigpu: the store on port %s listens on every interface: %r resolves here only "
            "to loopback (or not to this machine); give --iface NAME (or --local-addr) to bind "
            "the cluster interface",
            port,
            host,
        )
        return make_store(**given)
    try:
        sock = _listening_socket(address, port)
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            log.debug("binding the store to %s:%s failed (%s); torch binds it", address, port, e)
        return make_store(**given)
    given.update(port=sock.getsockname()[1], master_listen_fd=sock.fileno())
    try:
        store = make_store(**given)
    except BaseException:
        with contextlib.suppress(OSError):
            sock.close()
        raise
    sock.detach()  # the store's server owns the socket now (and closes it)
    log.debug("store server listens on %s:%s", address, given["port"])
    return store

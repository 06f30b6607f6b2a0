"""Where a launch's rendezvous store lives, and whether the network lets it: the port this node
will host (free?), the endpoint it dials (answering as a store?), ``--iface``'s interface.

``multigpu run`` checks them before starting anything: a port that another program holds, an
endpoint that does not answer, or an interface that does not exist is named at once (one line)
instead of failing inside torchrun's agent as a long rendezvous timeout or a deep traceback.

``--iface NAME`` makes gloo and NCCL use that interface (``GLOO_SOCKET_IFNAME``,
``NCCL_SOCKET_IFNAME``) and, unless ``--local-addr`` is given, makes the elastic agent
advertise its address to the other nodes. Both matter on machines with several networks, and
on the many Linux installations whose hostname resolves to 127.0.1.1: there the agent would
publish an address that other nodes cannot reach.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
from typing import Any

from multigpu.common.host import interface_address, interface_names, local_addresses
from multigpu.errors import UsageError
from multigpu.launch.options import LaunchOptions


def check_interface(name: str) -> str | None:
    """Raise UsageError unless interface ``name`` exists here; return its IPv4 address, if any."""
    names = interface_names()
    if name not in names:
        raise UsageError(
            f"--iface {name}: no such network interface on this machine ({socket.gethostname()}); "
            f"expected one of: {', '.join(names) or 'none found'}; pick the one on the network "
            "that connects the nodes (`ip -br addr`)"
        )
    return interface_address(name)


def is_local_address(host: str) -> bool:
    """True when ``host`` names this machine (loopback, its hostname, or one of its addresses).

    The test is to bind a socket to each address ``host`` resolves to: only a local address
    can be bound, whatever the interface.
    """
    return host.strip("[]") in ("", "localhost") or bool(local_addresses(host))


def check_port_free(port: int, *, option: str) -> None:
    """Raise UsageError when TCP ``port`` cannot be bound on this machine (another server has it).

    Binds every interface as torch's TCPStore server does; SO_REUSEADDR keeps ports in TIME_WAIT
    from a run that just ended from counting as taken (the store sets it too). ``option`` says
    how the user chose the port, for the message (``"--master-port 29500"``).
    """
    if not 0 <= port <= 65535:
        raise UsageError(
            f"{option}: port {port} is out of range; expected 1-65535; pick a free port"
        )
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 on this machine: the IPv4 try decides
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((address, port))
            except OSError as e:
                if e.errno != errno.EADDRINUSE and family == socket.AF_INET6:
                    continue
                raise UsageError(
                    f"{option}: port {port} is already in use on this machine, which hosts the "
                    "rendezvous store; expected a free port; stop the other job or choose "
                    "another port"
                ) from e
            return


def check_store_answers(host: str, port: int, *, option: str, wait_s: float) -> None:
    """Raise UsageError when something listens at ``host:port`` but is not a rendezvous store.

    torch 2.13's TCPStore client waits forever, whatever its timeout, for a reply from a
    program that accepts the connection but never answers (measured: still waiting after 90 s
    with ``--timeout 8``) — e.g. another program that holds the port on the store's node, which
    makes torch's agent fall back from hosting the store to being its client. So the launcher
    first connects as a store client itself, in a thread it can give up on. Nothing listening
    yet is fine (the store's node may start later; the rendezvous timeout bounds that wait), and
    a real store answers in milliseconds.
    """
    try:
        socket.create_connection((host, port), timeout=min(wait_s, 1.0)).close()
    except OSError:
        return  # nothing there (yet), or unreachable: the agent's bounded waits report it
    if not _answers_as_store(host, port, wait_s):
        raise UsageError(
            f"{option}: a program listens at {host}:{port} but does not answer as a rendezvous "
            f"store within {wait_s:g} s (torch would wait for it forever); expected the port free "
            f"on the store's node, or held by this job's store: stop the program that holds port "
            f"{port} on {host} (`ss -ltnp 'sport = :{port}'` shows it) or choose another port"
        )


def _answers_as_store(host: str, port: int, wait_s: float) -> bool:
    """Whether a TCPStore client at ``host:port`` gets an answer (any: an error is one too)
    within ``wait_s``.

    The client runs in a forked child that is killed when the time is up: a client left
    waiting in a thread of this process made it abort at exit (SIGABRT, "terminate called
    without an active exception", from the client's C++ thread).
    """
    import time
    from datetime import timedelta

    from torch.distributed import TCPStore

    child = os.fork()
    if child == 0:  # the child: connect quietly, and leave without Python's teardown
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)  # torch's client logs each retry: the parent words the outcome
            TCPStore(host, port, is_master=False, timeout=timedelta(seconds=wait_s),
                     wait_for_workers=False)  # fmt: skip
        except BaseException:  # an error is an answer too
            pass
        os._exit(0)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        done, _ = os.waitpid(child, os.WNOHANG)
        if done:
            return True
        time.sleep(0.05)
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
    return False


def store_port(options: LaunchOptions) -> tuple[str, int] | None:
    """The (option, port) of the rendezvous store this node will host, if it is a fixed port.

    Static rendezvous: node rank 0 hosts ``--master-port`` (or the ``--rdzv-endpoint`` port).
    c10d rendezvous: the node whose address is the endpoint's hosts it — checked only when it
    surely does (single node, or ``is_host=1`` in ``--rdzv-conf``), because on a multi-node
    test machine the port may rightly be held by another agent of the same job.
    """
    if options.get("standalone"):
        return None  # torchrun picks a free port
    backend = str(options.get("rdzv_backend", "static"))
    endpoint = str(options.get("rdzv_endpoint", "") or "")
    if backend == "static":
        if int(options.get("node_rank", 0)) != 0:
            return None
        if endpoint:
            return _endpoint_port(endpoint)
        if options.given("master_port"):
            port = int(options.get("master_port"))
            return f"--master-port {port}", port
        if options.max_nodes > 1:  # one node without a port: torchrun picks a free one
            return "torchrun's default --master-port 29500", 29500
        return None
    conf = str(options.get("rdzv_conf", "") or "").replace(" ", "").lower()
    hosts = options.max_nodes == 1 or any(f"is_host={v}" in conf for v in ("1", "true", "yes"))
    if endpoint and hosts:
        found = _endpoint_port(endpoint)
        if found is not None and is_local_address(endpoint.rpartition(":")[0]):
            return found
    return None


def _endpoint_port(endpoint: str) -> tuple[str, int] | None:
    _, sep, port_text = endpoint.rpartition(":")
    if not sep or not port_text.isdigit():
        return None  # torchrun's default port applies; it reports a bad endpoint itself
    return f"--rdzv-endpoint {endpoint}", int(port_text)


def rendezvous_endpoint(options: LaunchOptions) -> tuple[str, int] | None:
    """(host, port) this node's agent will connect to on several nodes; None on one node."""
    if options.max_nodes == 1 or options.get("standalone"):
        return None
    endpoint = str(options.get("rdzv_endpoint", "") or "")
    if endpoint:
        host, sep, port_text = endpoint.rpartition(":")
        return (host.strip("[]"), int(port_text)) if sep and port_text.isdigit() else None
    host = str(options.get("master_addr", "") or "127.0.0.1")
    return host, int(options.get("master_port", 29500) or 29500)


def endpoint_option(options: LaunchOptions) -> str:
    """How the user named the rendezvous endpoint, for messages."""
    return "--rdzv-endpoint" if options.get("rdzv_endpoint") else "--master-addr/--master-port"


def dialled_store(params: Any) -> tuple[str, int] | None:
    """(host, port) of the rendezvous store this node's agent will dial as a client, for torch's
    ``RendezvousParameters``; None when this node hosts it, or for other backends (etcd).

    Static rendezvous: node rank 0 hosts it. c10d: ``is_host`` in ``--rdzv-conf``, else the node
    whose address the endpoint names (torch's own guess, made the same way: a local address).
    """
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    if params.backend == "static":
        if int(params.config.get("rank", 0)) == 0:
            return None
        return parse_rendezvous_endpoint(params.endpoint, default_port=29500)
    if params.backend != "c10d":
        return None
    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=29400)
    is_host = params.get_as_bool("is_host")
    if is_host is None:
        is_host = is_local_address(host)
    return None if is_host else (host, port)

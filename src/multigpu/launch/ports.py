"""Ports: is a rendezvous port free here, and is an address one of this machine's.

A port already in use on the node that must host torchrun's store would otherwise surface as a
long rendezvous timeout or a deep traceback; trying to bind it first gives a one-line error.
"""

from __future__ import annotations

import contextlib
import errno
import socket

from multigpu.errors import UsageError


def is_local_address(host: str) -> bool:
    """True when ``host`` names this machine (loopback, its hostname, or one of its addresses).

    The test is to bind a socket to each address ``host`` resolves to: only a local address
    can be bound, whatever the interface.

    Example:
        >>> is_local_address("127.0.0.1")
        True
    """
    host = host.strip("[]")
    if host in ("", "localhost"):
        return True
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, _, _, _, sockaddr in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.bind((sockaddr[0], 0))
            return True
        except OSError:
            continue
    return False


def check_port_free(port: int, *, option: str) -> None:
    """Raise UsageError when TCP ``port`` cannot be bound on this machine (another server has it).

    Binds every interface as torch's TCPStore server does; SO_REUSEADDR keeps ports in TIME_WAIT
    from a run that just ended from counting as taken (the store sets it too).

    Args:
        port: the port this node will host the rendezvous store on.
        option: how the user chose it, for the message (e.g. ``"--master-port 29500"``).

    Example:
        >>> check_port_free(0, option="--master-port 0")
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

    Example:
        >>> check_store_answers("127.0.0.1", 1, option="--rdzv-endpoint", wait_s=1)
    """
    import threading
    from datetime import timedelta

    from torch.distributed import TCPStore

    try:
        socket.create_connection((host, port), timeout=min(wait_s, 1.0)).close()
    except OSError:
        return  # nothing there (yet), or unreachable: the agent's bounded waits report it
    answered = threading.Event()

    def probe() -> None:
        # An error is an answer too: the agent meets it again and reports it.
        with contextlib.suppress(Exception):
            TCPStore(host, port, is_master=False, timeout=timedelta(seconds=wait_s),
                     wait_for_workers=False)  # fmt: skip
        answered.set()

    threading.Thread(target=probe, daemon=True, name="multigpu-store-probe").start()
    if not answered.wait(wait_s):
        raise UsageError(
            f"{option}: a program listens at {host}:{port} but does not answer as a rendezvous "
            f"store within {wait_s:g} s (torch would wait for it forever); expected the port free "
            f"on the store's node, or held by this job's store: stop the program that holds port "
            f"{port} on {host} (`ss -ltnp 'sport = :{port}'` shows it) or choose another port"
        )

"""Ports: is a rendezvous port free here, and is an address one of this machine's.

A port already in use on the node that must host torchrun's store would otherwise surface as a
long rendezvous timeout or a deep traceback; trying to bind it first gives a one-line error.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket

from multigpu.errors import UsageError
from multigpu.host import local_addresses


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
    without an active exception", from the client's C++ thread). Without ``fork`` (not POSIX)
    a daemon thread does it, as before.
    """
    import threading
    import time
    from datetime import timedelta

    from torch.distributed import TCPStore

    def connect() -> None:
        TCPStore(host, port, is_master=False, timeout=timedelta(seconds=wait_s),
                 wait_for_workers=False)  # fmt: skip

    if not hasattr(os, "fork"):
        answered = threading.Event()

        def probe() -> None:
            with contextlib.suppress(Exception):
                connect()
            answered.set()

        threading.Thread(target=probe, daemon=True, name="multigpu-store-probe").start()
        return answered.wait(wait_s)
    child = os.fork()
    if child == 0:  # the child: connect quietly, and leave without Python's teardown
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)  # torch's client logs each retry: the parent words the outcome
            connect()
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

"""Store servers listen on the address their clients dial (``multigpu.common.store_listen``).

Each torch path that makes a ``TCPStore`` server is driven through its public entry point, once
as torch leaves it (every interface: the reason for ``store_listen``; if torch one day binds one
address itself, that half fails and the hook can go) and once through
``torch_compat.store_servers_made_by`` (loopback only). These are also the canaries of the hook:
a torch that stops making its servers through the names it patches fails the second half.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

from multigpu.common.store_listen import listen_address, listening_store
from multigpu.testing import free_port
from multigpu.testing.listeners import listening
from multigpu.torch_compat import store_servers_made_by


def _listening_on(port: int) -> list[str]:
    """The local addresses this machine listens on at ``port``."""
    return [a.rsplit(":", 1)[0] for a in listening().values() if a.endswith(f":{port}")]


def _worker_store(port: int) -> Any:
    store, _, _ = next(dist.rendezvous(f"tcp://127.0.0.1:{port}?rank=0&world_size=1"))
    return store


def _c10d_store(port: int) -> Any:
    params = RendezvousParameters("c10d", f"localhost:{port}", "canary", 1, 1)
    return get_rendezvous_handler(params)  # the handler owns its store


def _static_store(port: int) -> Any:
    params = RendezvousParameters("static", f"127.0.0.1:{port}", "canary", 1, 1, rank=0)
    handler = get_rendezvous_handler(params)
    handler.next_rendezvous()  # the static backend makes its store on the first round
    return handler


def _shared_server(port: int) -> Any:
    """The store the dynamic handler shares with its workers (made on the first round, on a
    free port: found as the port that is not the rendezvous store's)."""
    handler = _c10d_store(port)
    info = handler.next_rendezvous()
    return handler, info.bootstrap_store_info.master_port


PATHS: dict[str, Callable[[int], Any]] = {
    "env/tcp init_process_group (rank 0 hosts)": _worker_store,
    "c10d rendezvous backend": _c10d_store,
    "static rendezvous": _static_store,
}


@contextlib.contextmanager
def _hooked(on: bool) -> Iterator[None]:
    if not on:
        yield
        return
    with store_servers_made_by(functools.partial(listening_store, many_nodes=False)):
        yield


@pytest.mark.parametrize("hooked", [False, True], ids=["torch", "multigpu"])
@pytest.mark.parametrize("path", list(PATHS))
def test_each_store_server_listens_on_loopback_only_through_the_hook(
    path: str, hooked: bool
) -> None:
    port = free_port()
    with _hooked(hooked):
        keep = PATHS[path](port)  # noqa: F841 - the server lives as long as its store
        addresses = _listening_on(port)
    assert addresses, f"{path}: nothing listens on {port}"
    loopback = all(ipaddress.ip_address(a).is_loopback for a in addresses)
    assert loopback == hooked, f"{path}: listens on {addresses}"


@pytest.mark.parametrize("hooked", [False, True], ids=["torch", "multigpu"])
def test_the_store_the_agent_shares_with_its_workers_listens_on_loopback_through_the_hook(
    hooked: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)
    with _hooked(hooked):
        handler, port = _shared_server(free_port())
        addresses = _listening_on(port)
    del handler
    assert addresses
    assert all(ipaddress.ip_address(a).is_loopback for a in addresses) == hooked, addresses


def test_the_listen_address_is_the_one_clients_dial() -> None:
    assert listen_address("localhost", many_nodes=False) == "127.0.0.1"
    assert listen_address("127.0.0.1", many_nodes=False) == "127.0.0.1"
    # several nodes and a name that is only loopback here: the way in is unknown
    assert listen_address("localhost", many_nodes=True) is None
    assert listen_address("192.0.2.1", many_nodes=False) is None  # TEST-NET-1: not this machine
    assert listen_address("no-such-host.invalid", many_nodes=False) is None


def test_the_hook_is_undone_and_clients_pass_through() -> None:
    rendezvous = sys.modules["torch.distributed.rendezvous"]  # dist.rendezvous is a function
    before = rendezvous.TCPStore
    seen: list[dict[str, Any]] = []

    def make(store: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs)
        return listening_store(store, *args, many_nodes=False, **kwargs)

    port = free_port()
    with store_servers_made_by(make, elastic=False):
        server = _worker_store(port)
        client, _, _ = next(dist.rendezvous(f"tcp://127.0.0.1:{port}?rank=1&world_size=2"))
    assert rendezvous.TCPStore is before
    assert [kw.get("is_master") for kw in seen] == [True, False]
    client.set("k", "v")
    assert server.get("k") == b"v"
    assert os.environ.get("MASTER_ADDR") is None  # nothing written to the environment

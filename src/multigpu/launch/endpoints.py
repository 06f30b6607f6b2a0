"""Where a launch's rendezvous store lives: the port this node will host, the endpoint it dials.

``multigpu run`` checks both before starting anything: a port that another program holds, or an
endpoint that does not answer, is named at once instead of failing inside torchrun's agent.
"""

from __future__ import annotations

from typing import Any

from multigpu.launch.options import LaunchOptions
from multigpu.launch.ports import is_local_address


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

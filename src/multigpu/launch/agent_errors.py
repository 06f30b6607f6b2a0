"""One line for an error of torchrun's agent (rendezvous, store), naming the node and the fix.

torch says "The connection to the C10d store has failed. See inner exception for details." and
leaves the user to dig the address out of a traceback. Here the message names the rendezvous
endpoint, this machine, what was waited for and for how long, and what to check.
"""

from __future__ import annotations

import re
import socket
from typing import Any

from multigpu.store_reach import StoreUnreachable


def root_cause(error: BaseException) -> str:
    """``Type: first line`` of the innermost exception of ``error``'s chain."""
    seen: set[int] = set()
    while (error.__cause__ or error.__context__) is not None and id(error) not in seen:
        seen.add(id(error))
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(":. ")


def endpoint_of(args: Any) -> str:
    """The rendezvous endpoint torchrun uses for parsed torchrun ``args``."""
    endpoint = str(getattr(args, "rdzv_endpoint", "") or "")
    if endpoint:
        return endpoint
    return f"{getattr(args, 'master_addr', '127.0.0.1')}:{getattr(args, 'master_port', 29500)}"


def _named_by(args: Any) -> str:
    given = getattr(args, "rdzv_endpoint", "")
    return "--rdzv-endpoint" if given else "--master-addr:--master-port"


def describe_agent_error(error: BaseException, args: Any, timeout_s: float) -> str:
    """The one-line message for ``error`` raised by ``torch.distributed.run.run(args)``."""
    from torch.distributed.elastic.rendezvous.api import (
        RendezvousClosedError,
        RendezvousConnectionError,
        RendezvousTimeoutError,
    )

    endpoint = endpoint_of(args)
    here = socket.gethostname()
    cause = root_cause(error)
    nnodes = getattr(args, "nnodes", "?")
    # Another node's launcher ends first when it gave up waiting for the nodes; which of the
    # endings below this node sees is a race, so each names this node's --nnodes.
    same_options = (
        f"when it timed out waiting for the other nodes, the nodes disagree on --nnodes (this "
        f"node, {here}: --nnodes {nnodes}), --rdzv-id or --rdzv-endpoint: start every node with "
        "the same ones"
    )
    host = endpoint.rsplit(":", 1)[0]
    if isinstance(error, StoreUnreachable):  # our wait before torch's client dials
        return (
            f"{here} waited {timeout_s:g} s (--timeout) for the rendezvous store at "
            f"{error.host}:{error.port} ({_named_by(args)} {endpoint}) and nothing "
            f"answered ({error.last_error}): {host} is down or cut off, or its `multigpu run` "
            "(node rank 0, which hosts the store) is not started or has ended; start it, check "
            "the address and port, the network between the nodes (--iface) and that every node "
            "gives the same endpoint"
        )
    joined = re.search(r"(\d+)/(\d+) clients joined", f"{error} {cause}")
    if joined:  # this node hosts the store (static rendezvous, node rank 0): nobody came
        return (
            f"{here} hosts the rendezvous store at {endpoint} and waited {timeout_s:g} s "
            f"(--timeout) for the other nodes' launchers to connect: only {joined[1]} of "
            f"{joined[2]} did (--nnodes {nnodes}): start `multigpu run` on every node with the "
            f"same --nnodes and {_named_by(args)} {endpoint} and its own --node-rank, or raise "
            "--timeout"
        )
    if isinstance(error, RendezvousTimeoutError):
        return (
            f"not every node joined the rendezvous at {endpoint} within {timeout_s:g} s "
            f"({cause}); {here} expected --nnodes {nnodes}: start `multigpu run` with the same "
            "--rdzv-endpoint, --rdzv-id and --nnodes on every node, or raise --timeout"
        )
    if isinstance(error, RendezvousClosedError):
        return (
            f"the rendezvous at {endpoint} is closed: another node's launcher ended the job "
            f"({cause}) — see its output; {same_options}, and a new --rdzv-id"
        )
    text = f"{type(error).__name__}: {error} {cause}".lower()
    store_lost = isinstance(error, RendezvousConnectionError) or any(
        word in text for word in ("connect", "timed out", "timeout", "no route", "broken pipe")
    )
    if store_lost and any(w in text for w in ("likely closed", "connection reset", "eof")):
        # The store answered before and then hung up: its host's launcher ended.
        return (
            f"the rendezvous store at {endpoint} closed its connection to {here} ({cause}): "
            f"the `multigpu run` on {host} has ended — see its output; {same_options}"
        )
    if store_lost:
        return (
            f"the rendezvous store at {endpoint} is unreachable from {here} ({cause}; waited "
            f"up to --timeout {timeout_s:g} s): {host} is down or cut off, or its `multigpu run` "
            "is not started or has ended (the node at that address hosts the store; the job "
            "cannot go on without it, restarts included); check the address and port, the "
            "network between the nodes (--iface) and that every node gives the same "
            "--rdzv-endpoint"
        )
    return f"the launch failed: {type(error).__name__}: {error}"

"""Network interfaces for ``--iface``: does it exist on this machine, and what is its address.

``--iface NAME`` makes gloo and NCCL use that interface (``GLOO_SOCKET_IFNAME``,
``NCCL_SOCKET_IFNAME``) and, unless ``--local-addr`` is given, makes the elastic agent
advertise its address to the other nodes. Both matter on machines with several networks, and
on the many Linux installations whose hostname resolves to 127.0.1.1: there the agent would
publish an address that other nodes cannot reach.
"""

from __future__ import annotations

import socket

from multigpu.errors import UsageError
from multigpu.host import interface_address, interface_names


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

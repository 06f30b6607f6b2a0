"""Network interfaces for ``--iface``: does it exist on this machine, and what is its address.

``--iface NAME`` makes gloo and NCCL use that interface (``GLOO_SOCKET_IFNAME``,
``NCCL_SOCKET_IFNAME``) and, unless ``--local-addr`` is given, makes the elastic agent
advertise its address to the other nodes. Both matter on machines with several networks, and
on the many Linux installations whose hostname resolves to 127.0.1.1: there the agent would
publish an address that other nodes cannot reach.
"""

from __future__ import annotations

import socket
import struct

from multigpu.errors import UsageError

_SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address


def interface_names() -> list[str]:
    """The network interfaces of this machine (of this network namespace), sorted.

    Example:
        >>> "lo" in interface_names()  # doctest: +SKIP
        True
    """
    try:
        return sorted(name for _, name in socket.if_nameindex())
    except OSError:  # no netlink (not Linux): nothing to offer
        return []


def interface_address(name: str) -> str | None:
    """The IPv4 address of interface ``name``, or None when it has none (or this is not Linux).

    Example:
        >>> interface_address("lo")  # doctest: +SKIP
        '127.0.0.1'
    """
    try:
        import fcntl
    except ImportError:  # not POSIX
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            request = struct.pack("256s", name.encode()[:15])
            packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def check_interface(name: str) -> str | None:
    """Raise UsageError unless interface ``name`` exists here; return its IPv4 address, if any.

    Example:
        >>> check_interface("nope")  # doctest: +SKIP
        Traceback (most recent call last):
        multigpu.errors.UsageError: --iface nope: no such network interface on this machine ...
    """
    names = interface_names()
    if name not in names:
        raise UsageError(
            f"--iface {name}: no such network interface on this machine ({socket.gethostname()}); "
            f"expected one of: {', '.join(names) or 'none found'}; pick the one on the network "
            "that connects the nodes (`ip -br addr`)"
        )
    return interface_address(name)


def loopback_interface() -> str | None:
    """The name of this machine's loopback interface (``lo`` on Linux), or None if none is found.

    Example:
        >>> loopback_interface()  # doctest: +SKIP
        'lo'
    """
    for name in interface_names():
        address = interface_address(name)
        if address is not None and address.startswith("127."):
            return name
    return None

"""Neutral facts about this machine, read the same way by the launcher and by ``multigpu doctor``:
the CPU cores this process may use, and the network interfaces (name, state, MTU, IPv4).

Interfaces are listed with netlink (``socket.if_nameindex``) and read with ioctls on a socket,
not from ``/sys/class/net``: sysfs shows the network namespace that mounted it, which is not this
process's inside a container or test host entered with ``nsenter``.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
from dataclasses import dataclass

_IFF_UP, _IFF_LOOPBACK, _IFF_RUNNING = 0x1, 0x8, 0x40
_SIOCGIFFLAGS, _SIOCGIFADDR, _SIOCGIFMTU = 0x8913, 0x8915, 0x8921


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask), as the launcher counts them."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True, kw_only=True)
class Interface:
    """One network interface of this machine (of this process's network namespace)."""

    name: str
    """``eth0``, ``lo``, ``ib0``."""
    up: bool
    """Administratively up (``IFF_UP``)."""
    carrier: bool
    """Its link is up too (``IFF_RUNNING``): it can carry traffic."""
    loopback: bool
    """``lo``."""
    mtu: int | None
    """Its MTU in bytes (None when not readable)."""
    ipv4: str | None = None
    """Its IPv4 address, if it has one."""

    @property
    def usable(self) -> bool:
        """Up with a link: gloo and NCCL can use it."""
        return self.up and self.carrier

    def describe(self) -> str:
        """``"up, MTU 1500, 10.0.0.2"``, or ``"up, MTU 65536, 127.0.0.1 (loopback)"``."""
        state = "up" if self.usable else ("up, no carrier" if self.up else "down")
        parts = [state, f"MTU {self.mtu}" if self.mtu else "MTU ?", self.ipv4 or "no IPv4 address"]
        return ", ".join(parts) + (" (loopback)" if self.loopback else "")


def interface_names() -> list[str]:
    """The network interfaces of this machine (of this network namespace), sorted."""
    try:
        return sorted(name for _, name in socket.if_nameindex())
    except OSError:  # no netlink (not Linux): nothing to offer
        return []


def read_interfaces(names: list[str] | None = None) -> list[Interface]:
    """Interfaces ``names`` (default: every one of this namespace), sorted by name ([] where
    netlink or ioctls are missing)."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:

        def ask(name: str, request: int) -> bytes | None:
            ifreq = name.encode()[:15].ljust(40, b"\0")  # struct ifreq: name[16] + a union
            try:
                return fcntl.ioctl(sock.fileno(), request, ifreq)
            except OSError:
                return None  # e.g. no IPv4 address on it, or no such interface

        for name in sorted(interface_names() if names is None else names):
            flags_raw, mtu_raw, addr_raw = (
                ask(name, r) for r in (_SIOCGIFFLAGS, _SIOCGIFMTU, _SIOCGIFADDR)
            )
            flags = struct.unpack_from("H", flags_raw, 16)[0] if flags_raw else 0
            found.append(
                Interface(
                    name=name,
                    up=bool(flags & _IFF_UP),
                    carrier=bool(flags & _IFF_RUNNING),
                    loopback=bool(flags & _IFF_LOOPBACK),
                    mtu=struct.unpack_from("i", mtu_raw, 16)[0] if mtu_raw else None,
                    ipv4=socket.inet_ntoa(addr_raw[20:24]) if addr_raw else None,
                )
            )
    return found


def interface_address(name: str) -> str | None:
    """The IPv4 address of interface ``name``, or None when it has none (or this is not Linux)."""
    found = read_interfaces([name])
    return found[0].ipv4 if found else None


def loopback_interface() -> str | None:
    """The name of this machine's loopback interface (``lo`` on Linux), or None if none is found."""
    for interface in read_interfaces():
        if interface.ipv4 is not None and interface.ipv4.startswith("127."):
            return interface.name
    return None


def local_addresses(host: str) -> list[str]:
    """The addresses ``host`` resolves to that belong to this machine, in resolver order.

    The test is to bind a socket to each: only a local address can be bound, whatever the
    interface (an empty host means ``localhost``).
    """
    try:
        infos = socket.getaddrinfo(host.strip("[]") or "localhost", None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    found: list[str] = []
    for family, _, _, _, sockaddr in infos:
        address = str(sockaddr[0])
        if address in found:
            continue
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.bind((address, 0))
        except OSError:
            continue
        found.append(address)
    return found

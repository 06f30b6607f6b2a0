"""Which TCP addresses a process and its descendants listen on (Linux ``/proc``).

For tests that check nothing of a job listens beyond loopback or the cluster interface: the
listening sockets of the network namespace (``/proc/net/tcp*``) matched to each process's
socket inodes.
"""

from __future__ import annotations

import ipaddress
import os


def listening(pid: int | None = None) -> dict[str, str]:
    """Socket inode -> the local address of every listening TCP socket of the network namespace
    of process ``pid`` (None: this process's)."""
    found: dict[str, str] = {}
    where = "self" if pid is None else str(pid)
    for table, size in (("tcp", 4), ("tcp6", 16)):
        with open(f"/proc/{where}/net/{table}") as fh:
            for line in fh.read().splitlines()[1:]:
                fields = line.split()
                if fields[3] != "0A":  # TCP_LISTEN
                    continue
                hex_addr, hex_port = fields[1].split(":")
                raw = bytes.fromhex(hex_addr)
                # /proc prints each 32-bit word in host (little-endian) order
                words = [raw[i : i + 4][::-1] for i in range(0, size, 4)]
                address = ipaddress.ip_address(b"".join(words))
                found[fields[9]] = f"{address}:{int(hex_port, 16)}"
    return found


def family(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                parent = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children.get(current, []))
    return out


def listeners_of(pid: int) -> dict[int, list[str]]:
    """The local addresses (``"127.0.0.1:29400"``) each process of ``pid``'s family listens on,
    in ``pid``'s network namespace (its descendants are taken to share it)."""
    table = listening(pid)
    out: dict[int, list[str]] = {}
    for member in family(pid):
        try:
            fds = os.listdir(f"/proc/{member}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{member}/fd/{fd}")
            except OSError:
                continue
            inode = target[len("socket:[") : -1] if target.startswith("socket:[") else ""
            if inode in table:
                out.setdefault(member, []).append(table[inode])
    return out

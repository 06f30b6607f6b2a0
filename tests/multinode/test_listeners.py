"""Nothing that ``multigpu run`` opens on one node listens beyond loopback.

The rendezvous store has no authentication (DESIGN.md, "Listeners"): on one node it must be
reachable from this machine only. The test lists the listening TCP sockets of the launcher and
of every worker (``/proc/net/tcp*`` matched to each process's socket inodes) while the job
runs.

Known to fail today (strict xfail, so the fix shows up): torch's TCPStore server (the agent's
rendezvous store, shared with the workers) binds every interface (``[::]``) and the launcher
holds a second such listener. The workers' own listeners are on loopback: gloo's sockets follow
``GLOO_SOCKET_IFNAME`` and each liveness port (``multigpu.hang.peers``) binds the address facing
the master.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.launch._util import child_env
from tests.multinode._util import SCRIPTS


def _listening() -> dict[str, str]:
    """Socket inode -> the local address of every listening TCP socket of this namespace."""
    found: dict[str, str] = {}
    for table, size in (("tcp", 4), ("tcp6", 16)):
        with open(f"/proc/net/{table}") as fh:
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


def _family(pid: int) -> list[int]:
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
    """The local addresses each process of ``pid``'s family listens on."""
    table = _listening()
    out: dict[int, list[str]] = {}
    for member in _family(pid):
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


@pytest.mark.xfail(
    strict=True, reason="torch's TCPStore servers in the launcher bind every interface"
)
def test_nothing_listens_beyond_loopback_on_one_node(tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    log = tmp_path / "run.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "multigpu", "run", "--cpu", "2", "--timeout", "30",
             str(SCRIPTS / "hold.py"), str(stop)],
            env=child_env(), cwd=tmp_path, stdout=fh, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while log.read_text().count("ready ") < 2 and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        assert log.read_text().count("ready ") == 2, log.read_text()[-3000:]
        found = listeners_of(proc.pid)
    finally:
        stop.touch()
        proc.wait(timeout=60)
    assert proc.returncode == 0, log.read_text()[-3000:]
    assert found  # the store at least: the listing works
    beyond = {
        pid: [a for a in addresses if not ipaddress.ip_address(a.rsplit(":", 1)[0]).is_loopback]
        for pid, addresses in found.items()
    }
    assert not any(beyond.values()), f"listening beyond loopback: {beyond}"

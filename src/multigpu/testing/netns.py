"""The namespace plumbing under ``multigpu.testing.hosts``: ``ip`` commands, anchors, pids.

Everything here acts on names this module's caller chose (``mg<pid>x<n>...``) and on processes
it started; nothing else on the machine is touched, except leftovers of a dead test process,
recognised by the pid in their names (``remove_stale``).
"""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
from pathlib import Path


class HostsError(RuntimeError):
    """The test hosts could not be created (an ``ip`` command failed)."""


SUBNET_BASE = "10.231"
"""Test subnets are ``10.231.X.0/24``: private, and rarely used by real networks."""

_STALE = re.compile(r"^mg([0-9a-f]+)x\d+[bnv]\d*$")


def ip(*args: str) -> str:
    """Run ``ip ARGS``; raise ``HostsError`` with its message when it fails."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise HostsError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done.stdout


def ip_quiet(*args: str) -> None:
    """Run ``ip ARGS`` for cleanup: a failure (already gone) is not an error."""
    subprocess.run(["ip", *args], capture_output=True, timeout=30)


def plug(netns: str, veth: str, bridge: str, interface: str, cidr: str) -> None:
    """Create namespace ``netns``: ``lo`` up, ``interface`` with address ``cidr`` on ``bridge``."""
    ip("netns", "add", netns)
    ip("link", "add", veth, "type", "veth", "peer", "name", interface, "netns", netns)
    ip("link", "set", veth, "master", bridge, "up")
    ip("-n", netns, "addr", "add", cidr, "dev", interface)
    ip("-n", netns, "link", "set", interface, "up")
    # lo is down in a new namespace; stores and gloo connect to 127.0.0.1 / the own address.
    ip("-n", netns, "link", "set", "lo", "up")


def start_anchor(netns: str, hostname: str, hosts_file: Path) -> subprocess.Popen[bytes]:
    """Start the process that holds a host's UTS and mount namespaces; return when it is ready.

    ``unshare --mount --propagation private`` makes the bind mount of the hosts file private to
    the host: the machine's ``/etc/hosts`` is never changed. The anchor then waits on its stdin,
    so it also ends by itself when the test process dies.
    """
    script = (
        f"hostname {hostname} && mount --bind {hosts_file} /etc/hosts && echo ready && exec cat"
    )
    anchor = subprocess.Popen(
        ["ip", "netns", "exec", netns, "unshare", "--uts", "--mount", "--propagation", "private",
         "--", "sh", "-c", script],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert anchor.stdout is not None  # for mypy: stdout=PIPE
    if anchor.stdout.readline().strip() != b"ready":
        _, err = anchor.communicate(timeout=10)
        raise HostsError(f"host {hostname} could not start: {err.decode().strip()}")
    return anchor


def stop_anchor(anchor: subprocess.Popen[bytes]) -> None:
    """End an anchor (its stdin closes; killed if it does not go)."""
    try:
        anchor.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        anchor.kill()
        anchor.wait(timeout=5)


def _netns_id(pid: int | str) -> tuple[int, int] | None:
    try:
        st = os.stat(f"/proc/{pid}/ns/net")
    except OSError:  # gone, or a zombie
        return None
    return st.st_dev, st.st_ino


def pids_in_netns_of(pid: int) -> list[int]:
    """Every live process in the network namespace of process ``pid`` (itself included)."""
    target = _netns_id(pid)
    if target is None:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _netns_id(entry) == target:
            found.append(int(entry))
    return sorted(found)


def free_subnet() -> ipaddress.IPv4Network:
    """A ``10.231.X.0/24`` that no address or route of this machine overlaps.

    The hosts' bridge has no address, so their traffic cannot reach the real network anyway;
    avoiding used subnets keeps addresses in test output unambiguous.
    """
    used = []
    for text in (ip("-4", "-o", "addr", "show"), ip("-4", "route", "show", "table", "all")):
        for word in text.split():
            try:
                used.append(ipaddress.ip_network(word, strict=False))
            except ValueError:
                continue
    start = os.getpid() % 250
    for k in range(250):
        net = ipaddress.IPv4Network(f"{SUBNET_BASE}.{1 + (start + k) % 250}.0/24")
        if not any(net.overlaps(u) for u in used if u.version == 4 and u.prefixlen > 0):
            return net
    raise HostsError(f"no free {SUBNET_BASE}.X.0/24 subnet on this machine")


def remove_stale() -> None:
    """Delete test namespaces and links whose creating process no longer exists."""
    names = ip("-o", "link", "show").split("\n")
    links = [line.split(":")[1].strip().split("@")[0] for line in names if line.count(":") >= 2]
    spaces = [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]
    for kind, items in (("link", links), ("netns", spaces)):
        for name in items:
            match = _STALE.match(name)
            if match and not Path(f"/proc/{int(match.group(1), 16)}").exists():
                ip_quiet(kind, "del", name)

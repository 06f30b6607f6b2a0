"""Test hosts: 2–3 "machines" on one Linux box, each a set of namespaces joined by a bridge.

Multi-node code needs machines with their own addresses, hostnames and links that can be cut.
``virtual_hosts(n)`` makes them from Linux namespaces (root only):

- a **network namespace** per host, with ``lo`` up (it is down in a new namespace, and torch's
  stores and gloo use it) and an ``eth0`` that is one end of a veth pair whose other end is
  plugged into a bridge in the root namespace. The bridge has no address, so the hosts reach
  each other and nothing else: no packet of theirs can leave the box;
- a **UTS namespace** with the host's own hostname and a **mount namespace** in which a private
  hosts file (every host's name → its address) is bind-mounted over ``/etc/hosts``. Without
  them every namespace shares the box's hostname, which resolves to 127.0.0.1, and c10d's
  "am I the store host" check, the agent's MASTER_ADDR and gloo's interface choice all go wrong.
  The box's own ``/etc`` is never written.

A small anchor process per host holds its UTS and mount namespaces; ``Host.run`` enters all
three with ``nsenter``. Everything — processes started in the hosts, anchors, veths, namespaces,
bridge — is removed when the ``with`` block ends, also on errors. Names carry this process's pid,
so leftovers of a test run that was killed are recognised and removed by the next one.
"""

from __future__ import annotations

import functools
import ipaddress
import itertools
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class HostsError(RuntimeError):
    """The test hosts could not be created (an ``ip`` command failed)."""


SUBNET_BASE = "10.231"
"""Test subnets are ``10.231.X.0/24``: private, and rarely used by real networks."""

_STALE = re.compile(r"^mg([0-9a-f]+)x\d+[bnv]\d*$")

INTERFACE = "eth0"

_COUNTER = itertools.count()


@functools.lru_cache(maxsize=1)
def hosts_available() -> str | None:
    """None when ``virtual_hosts`` can work here; otherwise the reason it cannot (for a skip)."""
    if not Path("/proc/self/ns/net").exists():  # Linux only (macOS has no namespaces)
        return "test hosts need Linux namespaces"
    if os.geteuid() != 0:
        return "test hosts need root (network namespaces, veth, bridge)"
    for tool in ("ip", "nsenter", "unshare", "mount", "hostname"):
        if shutil.which(tool) is None:
            return f"test hosts need the command {tool!r} (iproute2 / util-linux)"
    probe = subprocess.run(
        ["unshare", "--net", "--uts", "--mount", "true"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        return f"cannot create namespaces here: {probe.stderr.strip() or probe.returncode}"
    return None


@dataclass
class Host:
    """One test machine: its name (= hostname), address on the bridge and namespaces."""

    name: str
    """The hostname inside the host; resolves to ``address`` on every host."""
    address: str
    """Its IPv4 address on the test subnet (on ``interface``)."""
    interface: str = INTERFACE
    """Its network interface (inside its namespace), e.g. for ``--iface``."""
    netns: str = ""
    """The name of its network namespace (``ip netns``)."""
    veth: str = ""
    """The bridge-side end of its link, in the root namespace (down = link cut)."""
    anchor: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    """The process holding its UTS and mount namespaces."""
    started: list[subprocess.Popen[Any]] = field(default_factory=list, repr=False)

    def run(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        cwd: str | os.PathLike[str] | None = None,
        **popen: Any,
    ) -> subprocess.Popen[Any]:
        """Start ``argv`` inside this host (its network, hostname and hosts file).

        ``env`` is its whole environment and ``cwd`` its directory (default: this process's);
        ``popen`` holds more ``subprocess.Popen`` arguments (``stdout``, ``text``...).
        """
        if self.anchor is None or self.anchor.poll() is not None:
            raise HostsError(f"host {self.name} is not running (its anchor process ended)")
        wd = os.fspath(cwd) if cwd is not None else os.getcwd()
        # nsenter execs the command itself (no fork without --pid): Popen.pid is its pid.
        enter = ["nsenter", f"--target={self.anchor.pid}", "--net", "--uts", "--mount"]
        proc = subprocess.Popen(
            [*enter, f"--wd={wd}", "--", *argv],
            env=dict(os.environ if env is None else env),
            **popen,
        )
        self.started.append(proc)
        return proc

    def pids(self) -> list[int]:
        """Every process in this host's network namespace except its anchor.

        torchrun starts workers in sessions of their own, so a host's processes are found by
        namespace, not by process group.
        """
        if self.anchor is None:
            return []
        return [p for p in _pids_in_netns_of(self.anchor.pid) if p != self.anchor.pid]

    def kill_all(self) -> list[int]:
        """SIGKILL every process of this host (the host "dies"); return their pids."""
        killed: list[int] = []
        for _ in range(20):  # a process may fork while we kill: repeat until none is left
            found = self.pids()
            if not found:
                break
            for pid in found:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            time.sleep(0.05)
        for proc in self.started:  # wait for each (one that has ended returns at once)
            with suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        return sorted(set(killed))

    def cut_link(self) -> None:
        """Unplug this host from the bridge: its packets are dropped, nothing is told to anyone.

        The bridge-side end goes down; the host's own ``eth0`` keeps its address and routes, as
        when a cable or a switch port fails.
        """
        _ip("link", "set", self.veth, "down")

    def restore_link(self) -> None:
        """Plug the host back in."""
        _ip("link", "set", self.veth, "up")


@contextmanager
def virtual_hosts(n: int = 2, *, names: Sequence[str] | None = None) -> Iterator[list[Host]]:
    """Create ``n`` test hosts on a private bridge; remove everything when the block ends.

    Args:
        n: how many hosts (1–50), on a free ``10.231.X.0/24`` (one that no address or route of
            this machine uses); host i gets ``.11 + i``.
        names: their hostnames (default ``node0``, ``node1``, ...).

    Raises:
        HostsError: not possible here (see ``hosts_available``) or an ``ip`` command failed.
    """
    reason = hosts_available()
    if reason is not None:
        raise HostsError(reason)
    if not 1 <= n <= 50:
        raise HostsError(f"virtual_hosts(n={n}); expected 1 to 50 hosts")
    names = list(names) if names is not None else [f"node{i}" for i in range(n)]
    if len(names) != n or len(set(names)) != n:
        raise HostsError(f"names={names!r}; expected {n} distinct hostnames")
    _remove_stale()
    net = _free_subnet()
    # Interface names have at most 15 characters: "mg" + pid in hex + "x" + counter + suffix.
    token = f"mg{os.getpid():x}x{next(_COUNTER)}"
    bridge = f"{token}b"
    hosts = [
        Host(
            name=name,
            address=str(net.network_address + 11 + i),
            netns=f"{token}n{i}",
            veth=f"{token}v{i}",
        )
        for i, name in enumerate(names)
    ]
    with ExitStack() as cleanup:
        workdir = Path(tempfile.mkdtemp(prefix="multigpu-hosts-"))
        cleanup.callback(shutil.rmtree, workdir, ignore_errors=True)
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
        lines += [f"{h.address} {h.name}" for h in hosts]
        # The c10d store listens on a dual-stack socket and names each client by reverse lookup
        # of its IPv4-mapped address: without these lines the lookup fell through to DNS, which
        # a test host has not, and every run printed "[c10d] The hostname of the client socket
        # cannot be retrieved. err=-3" from C++ (EAI_AGAIN).
        lines += [f"::ffff:{h.address} {h.name}" for h in hosts]
        hosts_file = workdir / "hosts"
        hosts_file.write_text("\n".join(lines) + "\n")
        cleanup.callback(_ip_quiet, "link", "del", bridge)
        _ip("link", "add", bridge, "type", "bridge")
        _ip("link", "set", bridge, "up")
        for host in hosts:
            cleanup.callback(_ip_quiet, "netns", "del", host.netns)
            cleanup.callback(_ip_quiet, "link", "del", host.veth)
            cleanup.callback(_stop, host)
            _plug(host.netns, host.veth, bridge, INTERFACE, f"{host.address}/{net.prefixlen}")
            host.anchor = _start_anchor(host.netns, host.name, hosts_file)
        yield hosts


def _stop(host: Host) -> None:
    """Kill the host's processes, then end its anchor (stdin closed; killed if it does not go)."""
    host.kill_all()
    if host.anchor is None:
        return
    try:
        host.anchor.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        host.anchor.kill()
        host.anchor.wait(timeout=5)


def _ip(*args: str) -> str:
    """Run ``ip ARGS``; raise ``HostsError`` with its message when it fails."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise HostsError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done.stdout


def _ip_quiet(*args: str) -> None:
    """Run ``ip ARGS`` for cleanup: a failure (already gone) is not an error."""
    subprocess.run(["ip", *args], capture_output=True, timeout=30)


def _plug(netns: str, veth: str, bridge: str, interface: str, cidr: str) -> None:
    """Create namespace ``netns``: ``lo`` up, ``interface`` with address ``cidr`` on ``bridge``."""
    _ip("netns", "add", netns)
    _ip("link", "add", veth, "type", "veth", "peer", "name", interface, "netns", netns)
    _ip("link", "set", veth, "master", bridge, "up")
    _ip("-n", netns, "addr", "add", cidr, "dev", interface)
    _ip("-n", netns, "link", "set", interface, "up")
    # lo is down in a new namespace; stores and gloo connect to 127.0.0.1 / the own address.
    _ip("-n", netns, "link", "set", "lo", "up")


def _start_anchor(netns: str, hostname: str, hosts_file: Path) -> subprocess.Popen[bytes]:
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


def _netns_id(pid: int | str) -> tuple[int, int] | None:
    try:
        st = os.stat(f"/proc/{pid}/ns/net")
    except OSError:  # gone, or a zombie
        return None
    return st.st_dev, st.st_ino


def _pids_in_netns_of(pid: int) -> list[int]:
    """Every live process in the network namespace of process ``pid`` (itself included)."""
    target = _netns_id(pid)
    if target is None:
        return []
    return sorted(int(e) for e in os.listdir("/proc") if e.isdigit() and _netns_id(e) == target)


def _free_subnet() -> ipaddress.IPv4Network:
    """A ``10.231.X.0/24`` that no address or route of this machine overlaps.

    The hosts' bridge has no address, so their traffic cannot reach the real network anyway;
    avoiding used subnets keeps addresses in test output unambiguous.
    """
    used = []
    for text in (_ip("-4", "-o", "addr", "show"), _ip("-4", "route", "show", "table", "all")):
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


def _remove_stale() -> None:
    """Delete test namespaces and links whose creating process no longer exists."""
    names = _ip("-o", "link", "show").split("\n")
    links = [line.split(":")[1].strip().split("@")[0] for line in names if line.count(":") >= 2]
    spaces = [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]
    for kind, items in (("link", links), ("netns", spaces)):
        for name in items:
            match = _STALE.match(name)
            if match and not Path(f"/proc/{int(match.group(1), 16)}").exists():
                _ip_quiet(kind, "del", name)

"""The test hosts themselves: own hostnames and addresses, reachability, cut links, cleanup."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from multigpu.testing.hosts import HostsError, hosts_available, virtual_hosts

PROBE = """
import socket, sys
print(socket.gethostname(), socket.gethostbyname(socket.gethostname()))
for name in sys.argv[1:]:
    try:
        socket.create_connection((name, 9), timeout=1.0).close()
        print(name, "open")
    except ConnectionRefusedError:
        print(name, "refused")  # the host answered: reachable
    except OSError as e:
        print(name, "unreachable")
"""


def _ours() -> tuple[str, str]:
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return netns, links


@pytest.fixture(autouse=True)
def _need_hosts() -> None:
    reason = hosts_available()
    if reason is not None:
        pytest.skip(reason)


def test_hosts_have_own_names_reach_each_other_and_vanish_after() -> None:
    etc_hosts = Path("/etc/hosts").read_text()
    with virtual_hosts(3) as hosts:
        names = [h.name for h in hosts]
        assert names == ["node0", "node1", "node2"]
        assert len({h.address for h in hosts}) == 3
        a = hosts[0]
        out = a.run([sys.executable, "-c", PROBE, "node1", "node2"], stdout=subprocess.PIPE)
        lines = out.communicate(timeout=30)[0].decode().splitlines()
        assert lines[0] == f"node0 {a.address}"  # its own hostname, resolving to its address
        assert lines[1:] == ["node1 refused", "node2 refused"]  # reachable

        hosts[2].cut_link()
        out = a.run([sys.executable, "-c", PROBE, "node1", "node2"], stdout=subprocess.PIPE)
        assert out.communicate(timeout=30)[0].decode().splitlines()[1:] == [
            "node1 refused",
            "node2 unreachable",
        ]
        hosts[2].restore_link()

        # kill_all ends every process of the host, also those in sessions of their own.
        hosts[1].run(["sleep", "300"])
        hosts[1].run(["setsid", "sleep", "300"])
        time.sleep(0.3)
        assert len(hosts[1].pids()) == 2
        assert len(hosts[1].kill_all()) == 2 and hosts[1].pids() == []
        spaces = [h.netns for h in hosts]
        netns, links = _ours()
        assert all(s in netns for s in spaces)
    netns, links = _ours()
    assert not any(s in netns for s in spaces)  # namespaces, veths and bridge are gone
    assert not any(h.veth in links for h in hosts)
    assert Path("/etc/hosts").read_text() == etc_hosts  # the machine's own file untouched


def test_everything_is_removed_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError, match="boom"), virtual_hosts(2) as hosts:
        hosts[0].run(["sleep", "300"])
        raise RuntimeError("boom")
    netns, links = _ours()
    assert not any(h.netns in netns or h.veth in links for h in hosts)


def test_bad_arguments() -> None:
    with pytest.raises(HostsError, match="1 to 50"), virtual_hosts(0):
        pass
    with pytest.raises(HostsError, match="distinct"), virtual_hosts(2, names=["a", "a"]):
        pass

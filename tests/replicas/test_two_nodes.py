"""Two test hosts (network namespaces), one replica group each, meeting at a `--lighthouse` on
node0: node1 dies whole (every process SIGKILLed), node0 trains on, alone, to the same result.

Asserted on one run: node0's exit code, its longest pause between steps, its final parameters
against an uninterrupted run, and that nothing of either node listened beyond its own address or
loopback (the lighthouse included: torchft's own binds every interface).
"""

from __future__ import annotations

import ipaddress
import itertools
import time
from pathlib import Path
from subprocess import Popen

import pytest
import torch

from multigpu.testing.hosts import Host, hosts_available, virtual_hosts
from multigpu.testing.listeners import listeners_of
from tests.multinode._util import start
from tests.replicas.test_kill import JOB, _lines, _uninterrupted

pytest.importorskip("torchft", reason="torchft (pip install multigpu[ft]) is not installed")

EPOCHS = 2
KILL_AT = 20


def _start_both(node0: Host, node1: Host, out: Path, *options: str) -> list[Popen[bytes]]:
    """One replica group on each node, meeting at node0's lighthouse; returned once group 1
    passed its step ``KILL_AT``."""
    lighthouse = f"{node0.name}:29510"
    procs = [
        start(host, ["run", "--replicas", "2", "--replica-group", str(i), "--lighthouse",
                     lighthouse, "--iface", host.interface, "--cpu", "1", *options, str(JOB),
                     str(out), str(EPOCHS)], out / f"node{i}.log")
        for i, host in enumerate((node0, node1))
    ]  # fmt: skip
    deadline = time.monotonic() + 120
    while len(_lines(out / "steps-1-0")) < KILL_AT:
        logs = "".join(p.read_text()[-2000:] for p in out.glob("node*.log"))
        assert all(p.poll() is None for p in procs), logs
        assert time.monotonic() < deadline, logs
        time.sleep(0.05)
    return procs


def test_a_dead_node_leaves_the_other_training(tmp_path: Path, monkeypatch) -> None:
    reason = hosts_available()
    if reason is not None:
        pytest.skip(reason)
    monkeypatch.setenv("JOB_SLEEP", "0.04")  # start() passes the test's environment on
    with virtual_hosts(2) as (node0, node1):
        procs = _start_both(node0, node1, tmp_path)
        found = {h.address: listeners_of(p.pid) for h, p in zip((node0, node1), procs, strict=True)}
        node1.kill_all()
        code = procs[0].wait(timeout=120)
    log = (tmp_path / "node0.log").read_text()
    assert code == 0, log
    assert "replica group 0: replica group(s) 1 left the quorum" in log
    times = _lines(tmp_path / "steps-0-0")
    assert len(times) == EPOCHS * 50
    assert max(b - a for a, b in itertools.pairwise(times)) <= 5.0
    got = torch.load(tmp_path / "params-0-0.pt")
    plain = _uninterrupted(epochs=EPOCHS)
    assert max((got[k] - plain[k]).abs().max().item() for k in got) <= 1e-5
    for own, listeners in found.items():
        addresses = [a.rsplit(":", 1)[0] for addrs in listeners.values() for a in addrs]
        assert addresses
        beyond = [a for a in addresses if a != own and not ipaddress.ip_address(a).is_loopback]
        assert not beyond, (own, listeners)


@pytest.mark.parametrize("how", ["killed", "silent"])
def test_the_lighthouses_node_dying_ends_the_other_in_one_line_within_its_timeout(
    how: str, tmp_path: Path, monkeypatch
) -> None:
    """node0 hosts the lighthouse (and the job's record): killed whole (its connections reset),
    or cut off first and then killed (silent: no packet of it arrives, as when a machine loses
    power), node1's group can agree on no step; it ends within --timeout with one line naming
    what died, and restarts nothing."""
    reason = hosts_available()
    if reason is not None:
        pytest.skip(reason)
    timeout = 30
    monkeypatch.setenv("JOB_SLEEP", "0.04")
    with virtual_hosts(2) as (node0, node1):
        procs = _start_both(node0, node1, tmp_path, "--timeout", str(timeout))
        before = (tmp_path / "node1.log").read_text()
        if how == "silent":
            node0.cut_link()
        node0.kill_all()
        killed = time.monotonic()
        code = procs[1].wait(timeout=timeout + 90)
        took = time.monotonic() - killed
    print(f"node1 ended {took:.1f} s after node0 was {how} (--timeout {timeout})")  # -s shows it
    log = (tmp_path / "node1.log").read_text()
    after = log[len(before) :].strip().splitlines()
    assert code == 1, log
    # The product's bound: --timeout (the quorum's or the record's wait), and the group's end.
    assert took <= timeout + 30, (took, log)
    assert "restarting the workers" not in log[len(before) :]
    assert after[-1].startswith("multigpu: error: "), after
    assert "lighthouse" in after[-1] or "record" in after[-1], after[-1]
    assert "lost a peer" not in after[-1]  # the line names the cause itself
    assert len(after) <= 3, after  # the group's own line, at most its summary, the ending

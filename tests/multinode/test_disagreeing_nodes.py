"""Nodes started differently end within the timeout, every node naming the difference.

torch's c10d rendezvous takes each node's ``--nnodes`` at its word: nodes started with 2 and 3
either never complete a round (both wait out the join deadline) or complete one with 2 nodes and
train, node1's ``--nnodes 3`` ignored. The agents' agreement check after each round stops the
second case before a worker starts; the first ends on the deadlines, named.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from multigpu.testing.hosts import Host
from tests.multinode._util import (
    HUNG,
    PORT,
    TRAIN,
    c10d_args,
    host_env,
    last_line,
    start,
    start_timed,
    wait_all,
    wait_timed,
)

GRACE = 5  # the launcher's bound: --timeout + 5 s from its start (test_launcher_waits.py)
LOADED = 5
"""More for the two launchers' lazy imports (the elastic agent, torch.distributed.run) before
their rendezvous starts its --timeout: 8.25 s in all on a quiet machine, 13.7-14.3 s in the full
suite on 2 cores at a load average of about 13 (twice in a row). The rendezvous's own wait is the
8 s; where the other seconds went under load was not measured."""


def test_nodes_started_with_different_nnodes_end_within_the_timeout_saying_so(
    two_hosts: list[Host], tmp_path: Path
) -> None:
    node0, node1 = two_hosts
    logs = [tmp_path / f"{host.name}.log" for host in two_hosts]
    procs = [
        start_timed(host, ["run", "--cpu", "1", *c10d_args(node0, nnodes=n), "--timeout", "8",
                           TRAIN, str(tmp_path / "x.pt")], log)
        for host, n, log in ((node0, "2", logs[0]), (node1, "3", logs[1]))
    ]  # fmt: skip
    ended = [wait_timed(proc, log, timeout=HUNG) for proc, log in zip(procs, logs, strict=True)]
    out0, out1 = (log.read_text() for log in logs)
    assert None not in ended, (out0, out1)
    assert max(ended) <= 8 + GRACE + LOADED, (ended, out0, out1)  # type: ignore[type-var]
    assert not (tmp_path / "x.pt").exists() and "step 1 " not in out0 + out1
    last0, last1 = (last_line(log) for log in logs)
    if [p.returncode for p in procs] == [2, 2]:
        # The round completed with 2 nodes (node0's count): both agents stop before any worker.
        for last in (last0, last1):
            assert last.startswith("multigpu: error: the nodes were started with different "
                                   "--nnodes: "), last  # fmt: skip
            assert re.search(r"\b2 on node [01] \(node0\)", last), last
            assert re.search(r"\b3 on node [01] \(node1\)", last), last
        return
    assert [p.returncode for p in procs] == [1, 1], (out0, out1)
    # Each node ends on its own join deadline or, when the other's came first, on the rendezvous
    # that the other closed (node1's: on node0's store going away too) — a race either way: each
    # line names this node's --nnodes, and one node at least timed out.
    timed_out = []
    for last, node, nnodes in ((last0, "node0", 2), (last1, "node1", 3)):
        waited = "within 8 s" in last and f"{node} expected --nnodes {nnodes}" in last
        store_gone = "the `multigpu run` on node0 has ended" in last and node == "node1"
        closed = "the rendezvous at node0:29400 is closed" in last
        named = f"(this node, {node}: --nnodes {nnodes})" in last
        assert waited or ((store_gone or closed) and named), last
        timed_out.append(waited)
    assert any(timed_out), (last0, last1)
    assert "not every node joined the rendezvous at node0:29400 within 8 s" in (
        last0 if timed_out[0] else last1
    )


def _wait_for_store(node0: Host, node1: Host) -> None:
    """Until node0's rendezvous store answers node1 (node0's agent joins as it opens it)."""
    probe = f"import socket; socket.create_connection(('{node0.name}', {PORT}), 1).close()"
    began = time.monotonic()
    while node1.run([sys.executable, "-c", probe], host_env(), stderr=subprocess.DEVNULL).wait():
        assert time.monotonic() - began < HUNG, "node0's store never answered"
        time.sleep(0.2)


def test_a_round_completed_with_different_nnodes_stops_every_node_before_any_worker(
    two_hosts: list[Host], tmp_path: Path
) -> None:
    # node0 (the store) joins first expecting 3; node1, expecting 2, completes the round as the
    # second node: torch would start both nodes' workers, node0's --nnodes ignored. A timeout
    # well past node1's start (its imports took over 10 s under load: node0's join ran out).
    node0, node1 = two_hosts
    argv = ["--cpu", "1", "--timeout", "60", TRAIN, str(tmp_path / "x.pt")]
    logs = [tmp_path / f"{host.name}.log" for host in two_hosts]
    first = start_timed(node0, ["run", *c10d_args(node0, nnodes="3"), *argv], logs[0])
    _wait_for_store(node0, node1)
    time.sleep(1)
    second = start_timed(node1, ["run", *c10d_args(node0, nnodes="2"), *argv], logs[1])
    procs = [first, second]
    ended = [wait_timed(proc, log, timeout=HUNG) for proc, log in zip(procs, logs, strict=True)]
    outs = [log.read_text() for log in logs]
    assert None not in ended and [first.returncode, second.returncode] == [2, 2], outs
    # At once, after the round: node1's launcher nowhere near a wait of the 60 s timeout.
    # (node0's time counts its wait for node1 to be started, too.)
    assert ended[1] < 30, (ended, outs)  # type: ignore[operator]
    for log, out in zip(logs, outs, strict=True):
        assert last_line(log) == (
            "multigpu: error: the nodes were started with different --nnodes: 3 on node 0 "
            "(node0), 2 on node 1 (node1); start `multigpu run` with the same --nnodes on every "
            "node, and a new --rdzv-id"
        ), out[-2000:]
        assert "step 1 " not in out
    assert not (tmp_path / "x.pt").exists()


# node1's launcher as if another torch were installed there (its workers never start).
OTHER_TORCH = (
    "import sys, torch; torch.__version__ = '2.12.1'; "
    "from multigpu.cli.main import main; sys.exit(main(sys.argv[1:]))"
)


def test_a_node_with_another_torch_stops_every_node_before_any_worker_starts(
    two_hosts: list[Host], tmp_path: Path
) -> None:
    node0, node1 = two_hosts
    # A timeout well past node1's start, as above: node0's join must not run out before it.
    argv = ["run", "--cpu", "1", *c10d_args(node0), "--timeout", "60", TRAIN,
            str(tmp_path / "x.pt")]  # fmt: skip
    first = start(node0, argv, tmp_path / "node0.log")
    with (tmp_path / "node1.log").open("wb") as fh:
        other = node1.run([sys.executable, "-c", OTHER_TORCH, *argv], host_env(),
                          cwd=tmp_path, stdout=fh, stderr=subprocess.STDOUT)  # fmt: skip
    ended = wait_all([first, other], timeout=HUNG)
    outs = [(tmp_path / f"{h.name}.log").read_text() for h in two_hosts]
    assert None not in ended and [first.returncode, other.returncode] == [1, 1], outs
    for out in outs:
        last = out.strip().splitlines()[-1]
        assert last.startswith("multigpu: error: nodes run different software: torch "), last
        assert re.search(r"2\.12\.1 on node [01] \(node1\)", last), last
        assert "install the same versions on every node" in last
        assert "step 1 " not in out
    assert not (tmp_path / "x.pt").exists()

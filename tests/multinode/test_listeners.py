"""Nothing that ``multigpu run`` opens listens beyond loopback (one node) or the cluster address.

The rendezvous store has no authentication (DESIGN.md, "Listeners"): on one node it must be
reachable from this machine only, on several from the nodes' network only. The tests list the
listening TCP sockets of each launcher and its workers (``multigpu.testing.listeners``) while
the job runs:

- on this machine, a one-node job (the agent's rendezvous store and the store it shares with
  its workers);
- on test hosts whose hostname resolves to their network address (as on many real machines,
  where torch's defaults put the stores and gloo on that address): a one-node job, and a
  two-node job, both with ``--max-restarts 1`` (then rank 0's worker hosts the workers' store,
  not the agent). node0 is given ``--iface``, node1 not (its hostname decides).

Before ``store_listen`` every one of these failed: torch's TCPStore servers bind ``[::]``.
"""

from __future__ import annotations

import ipaddress
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from multigpu.testing.hosts import Host, hosts_available, virtual_hosts
from multigpu.testing.listeners import listeners_of
from tests.launch._util import child_env
from tests.multinode._util import SCRIPTS, c10d_args, start


def _wait_ready(procs: Sequence[subprocess.Popen[bytes]], logs: Sequence[Path], ranks: int) -> None:
    """Until ``ranks`` ``ready-RANK`` files are there (hold.py touches one beside its stop
    file; each job has its own folder)."""
    deadline = time.monotonic() + 120
    folder = logs[0].parent
    while time.monotonic() < deadline:
        if len(list(folder.glob("*/ready-*"))) >= ranks:
            return
        text = "".join(log.read_text()[-3000:] for log in logs)
        assert all(p.poll() is None for p in procs), text
        time.sleep(0.2)
    raise AssertionError(f"not every rank got ready within 120 s: {sorted(folder.rglob('*'))}")


def _beyond(found: dict[int, list[str]], allowed: set[str]) -> dict[int, list[str]]:
    def ok(address: str) -> bool:
        host = address.rsplit(":", 1)[0]
        return ipaddress.ip_address(host).is_loopback or host in allowed

    return {pid: bad for pid, addrs in found.items() if (bad := [a for a in addrs if not ok(a)])}


def test_nothing_listens_beyond_loopback_on_one_node(tmp_path: Path) -> None:
    (tmp_path / "job").mkdir()
    stop = tmp_path / "job" / "stop"
    log = tmp_path / "run.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "multigpu", "run", "--cpu", "2", "--timeout", "30",
             str(SCRIPTS / "hold.py"), str(stop)],
            env=child_env(), cwd=tmp_path, stdout=fh, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        _wait_ready([proc], [log], 2)
        found = listeners_of(proc.pid)
    finally:
        stop.touch()
        proc.wait(timeout=60)
    assert proc.returncode == 0, log.read_text()[-3000:]
    assert len(found) >= 2  # the launcher's store and the workers' gloo: the listing works
    assert not _beyond(found, set()), f"listening beyond loopback: {found}"


def test_on_hosts_stores_and_gloo_listen_on_loopback_or_the_cluster_address(
    tmp_path: Path,
) -> None:
    reason = hosts_available()
    if reason is not None:
        pytest.skip(reason)
    stops = [tmp_path / job / "stop" for job in ("pair", "alone")]  # one folder per job
    for stop in stops:
        stop.parent.mkdir()
    pair, lone = ([str(SCRIPTS / "hold.py"), str(stop)] for stop in stops)
    with virtual_hosts(3) as hosts:
        node0, node1, alone = hosts
        runs: list[tuple[Host, subprocess.Popen[bytes], set[str]]] = []
        logs = [tmp_path / f"{h.name}.log" for h in hosts]
        two = [*c10d_args(node0), "--max-restarts", "1", "--timeout", "30"]
        runs.append((node0, start(node0, ["run", "--cpu", "1", *two, "--iface", "eth0", *pair],
                                  logs[0]), {node0.address}))  # fmt: skip
        runs.append((node1, start(node1, ["run", "--cpu", "1", *two, *pair], logs[1]),
                     {node1.address}))  # fmt: skip
        one = ["run", "--cpu", "2", "--max-restarts", "1", "--timeout", "30", *lone]
        runs.append((alone, start(alone, one, logs[2]), set()))  # one node: loopback only
        procs = [proc for _, proc, _ in runs]
        try:
            _wait_ready(procs, logs, 4)
            found = {host.name: (listeners_of(proc.pid), allowed) for host, proc, allowed in runs}
        finally:
            for stop in stops:
                stop.touch()
            for proc in procs:
                proc.wait(timeout=60)
    text = "".join(log.read_text()[-2000:] for log in logs)
    assert [p.returncode for p in procs] == [0, 0, 0], text
    for name, (listeners, allowed) in found.items():
        assert sum(map(len, listeners.values())) >= 2, (name, listeners)  # gloo, liveness...
        assert not _beyond(listeners, allowed), f"{name} listens beyond {allowed}: {listeners}"

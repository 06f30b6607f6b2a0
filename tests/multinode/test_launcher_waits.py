"""A launcher whose other nodes never come ends within ``--timeout`` + 5 s, saying so.

On one machine, over loopback (the namespace tests in ``test_two_nodes`` cover a host that drops
every packet): node 1 whose store host (node rank 0) never starts, and node 0 whose node 1
never starts, with static and c10d rendezvous. Measured from the end of the launcher's imports
to the return of its ``main`` (``start_timed``). Before, node 1 of a static rendezvous took
23 s for --timeout 10 (torch's store client retried with back-off past its timeout), and node
0 said the store it hosts was "unreachable".
"""

from __future__ import annotations

import socket
from pathlib import Path

from tests.multinode._util import TRAIN, last_line, start_timed, wait_timed

TIMEOUT = 10
GRACE = 5  # the bound: a launcher ends within TIMEOUT + GRACE seconds of its start


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_nodes_alone_end_within_the_timeout_saying_what_they_waited_for(tmp_path: Path) -> None:
    ports = [free_port() for _ in range(3)]
    common = ["run", "--cpu", "1", "--nnodes", "2", "--timeout", str(TIMEOUT)]
    cases = {
        "static-node1": [*common, "--node-rank", "1", "--rdzv-endpoint", f"127.0.0.1:{ports[0]}"],
        "static-node0": [*common, "--node-rank", "0", "--master-port", str(ports[1])],
        "c10d-node0": [*common, "--rdzv-backend", "c10d", "--rdzv-id", "alone",
                       "--rdzv-endpoint", f"127.0.0.1:{ports[2]}"],
    }  # fmt: skip
    logs = {name: tmp_path / f"{name}.log" for name in cases}
    procs = {
        name: start_timed(None, [*argv, TRAIN, str(tmp_path / "x.pt")], logs[name])
        for name, argv in cases.items()
    }
    for name, proc in procs.items():
        seconds = wait_timed(proc, logs[name], timeout=120)
        out = logs[name].read_text()
        assert seconds is not None and proc.returncode == 1, (name, out[-3000:])
        last = last_line(logs[name])
        print(name, f"{seconds:.1f} s", last)
        assert seconds <= TIMEOUT + GRACE, (name, seconds, out[-3000:])
        assert last.startswith("multigpu: error: "), (name, out[-3000:])
    static1 = last_line(logs["static-node1"])
    assert f"waited {TIMEOUT} s (--timeout) for the rendezvous store at 127.0.0.1:{ports[0]}" in (
        static1
    )
    assert "nothing answered (Connection refused)" in static1
    c10d0 = last_line(logs["c10d-node0"])
    assert f"not every node joined the rendezvous at 127.0.0.1:{ports[2]} within {TIMEOUT} s" in (
        c10d0
    )
    static0 = last_line(logs["static-node0"])
    assert f"hosts the rendezvous store at 127.0.0.1:{ports[1]} and waited {TIMEOUT} s" in static0
    assert "only 1 of 2 did (--nnodes 2)" in static0
    assert not (tmp_path / "x.pt").exists()

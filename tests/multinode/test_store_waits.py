"""Waiting for the process group's store keeps to the timeout (workers outside a launcher).

A rank whose peers never come ends within ``MULTIGPU_TIMEOUT`` + 5 s with one line naming what
it waited for, how long and the store's address: torch's client alone took 23 s for 10 s and
ended in a bare ``DistNetworkError``; the store's host ended in a bare ``DistStoreError``.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

from tests.launch._util import child_env
from tests.multinode._util import SCRIPTS

TIMEOUT = 5
GRACE = 5  # the bound: every wait ends within TIMEOUT + GRACE seconds


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_rank(rank: int, port: int, world_size: int = 2) -> subprocess.Popen[str]:
    env = child_env(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "MULTIGPU_TIMEOUT": str(TIMEOUT),
        }
    )
    for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_USE_AGENT_STORE"):
        env.pop(name, None)
    return subprocess.Popen(
        [sys.executable, str(SCRIPTS / "init_alone.py")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def outcome(proc: subprocess.Popen[str]) -> dict[str, object]:
    out, err = proc.communicate(timeout=120)
    lines = out.strip().splitlines()
    assert lines, err[-3000:]
    return dict(json.loads(lines[-1]))


def test_a_rank_alone_ends_within_the_timeout_naming_what_it_waited_for() -> None:
    # Both at once (each alone on its own port): rank 1 whose store host (rank 0) never comes,
    # and rank 0, the store's host, whose peer never comes.
    client_port, host_port = free_port(), free_port()
    client, host = start_rank(1, client_port), start_rank(0, host_port)
    found = outcome(client)
    assert found.get("error") == "EnvError", found
    assert float(found["seconds"]) <= TIMEOUT + GRACE, found  # type: ignore[arg-type]
    message = str(found["message"])
    assert "\n" not in message
    assert f"rank 1 of 2 waited {TIMEOUT} s for the process group's store at " in message
    assert f"127.0.0.1:{client_port} (hosted by rank 0)" in message
    assert "Connection refused" in message

    found = outcome(host)
    assert found.get("error") == "EnvError", found
    assert float(found["seconds"]) <= TIMEOUT + GRACE, found  # type: ignore[arg-type]
    message = str(found["message"])
    assert "\n" not in message
    assert f"rank 0 of 2 (1 node(s)) waited {TIMEOUT} s at the process group's store" in message
    assert f"127.0.0.1:{host_port} for the other 1 of 2 ranks; only 1 of 2 joined" in message


def test_a_store_host_that_comes_late_within_the_timeout_is_joined() -> None:
    port = free_port()
    early = start_rank(1, port)
    time.sleep(2)  # rank 1 waits for the store meanwhile
    late = start_rank(0, port)
    for found in (outcome(early), outcome(late)):
        assert found.get("sum") == 2.0, found

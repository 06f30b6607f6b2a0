"""Helpers for multi-node tests: start ``multigpu run`` on a test host, collect its output."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from multigpu.testing.hosts import Host
from tests.launch._util import child_env

SCRIPTS = Path(__file__).resolve().parent / "scripts"
TRAIN = str(SCRIPTS / "train.py")
PORT = 29400  # each host has its own network: no other job can hold it there


def host_env() -> dict[str, str]:
    """The launcher tests' environment, minus ``GLOO_SOCKET_IFNAME=lo``: gloo must use eth0."""
    env = child_env({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    env.pop("GLOO_SOCKET_IFNAME", None)
    env.pop("MULTIGPU_TIMEOUT", None)
    return env


def c10d_args(store: Host, nnodes: str = "2") -> list[str]:
    """torchrun's c10d rendezvous options with ``store`` hosting the store."""
    return [
        "--nnodes", nnodes, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{store.name}:{PORT}",
        "--rdzv-id", "test-job",
    ]  # fmt: skip


def start(host: Host, argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """``python -m multigpu ARGV`` on ``host``, stdout and stderr to the file ``log``."""
    with log.open("wb") as fh:  # a file, not a pipe: nobody reads while the test waits
        return host.run(
            [sys.executable, "-m", "multigpu", *argv],
            host_env(),
            cwd=log.parent,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )


def wait_all(procs: Sequence[subprocess.Popen[bytes]], timeout: float) -> list[float | None]:
    """Wait for every process; return each one's seconds to exit (None: still running)."""
    began = time.monotonic()
    ended: list[float | None] = [None] * len(procs)
    while time.monotonic() - began < timeout and None in ended:
        for i, proc in enumerate(procs):
            if ended[i] is None and proc.poll() is not None:
                ended[i] = time.monotonic() - began
        time.sleep(0.1)
    return ended

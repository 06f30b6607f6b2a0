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
HUNG = 180
"""Seconds after which a launch counts as hung: these tests' patience, not a bound of the product.
A launch's interpreter start, imports and exit are bounded by nothing but the machine (at load
10-11 on 2 cores a node was not done 40 s after its start); what the product bounds by
``--timeout`` is measured from the launcher's own marks (``start_timed``) or from the event."""


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


START_MARK = "multigpu-test-start"
"""Printed by ``start_timed``'s launcher once its imports are done (then the wall clock time)."""
END_MARK = "multigpu-test-end"
"""Printed by ``start_timed``'s launcher when ``main`` has returned (then the wall clock time)."""

_TIMED = (
    "import sys, time\n"
    "import torch.distributed.run\n"
    "from multigpu.cli.main import main\n"
    "import multigpu.launch.run\n"  # what main imports on its way: before the clock, like torch
    f"print({START_MARK!r}, time.time(), flush=True)\n"
    "code = main(sys.argv[1:])\n"
    f"print({END_MARK!r}, time.time(), flush=True)\n"
    "sys.exit(code)\n"
)


def start_timed(host: Host | None, argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """``multigpu ARGV`` on ``host`` (None: here), marking when its imports are done and when
    ``main`` returns: on a loaded test machine importing torch alone took up to 12 s, and the
    interpreter's exit seconds more, which no timeout bounds."""
    command = [sys.executable, "-c", _TIMED, *argv]
    with log.open("wb") as fh:
        if host is not None:
            env = host_env()
            return host.run(command, env, cwd=log.parent, stdout=fh, stderr=subprocess.STDOUT)
        return subprocess.Popen(
            command, env=host_env(), cwd=log.parent, stdout=fh, stderr=subprocess.STDOUT
        )


def wait_timed(proc: subprocess.Popen[bytes], log: Path, timeout: float) -> float | None:
    """Wait for ``proc`` (from ``start_timed``); its seconds from the start mark to the end
    mark, None when it is still running after ``timeout``."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    marks = {}
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith((START_MARK, END_MARK)):
            name, _, value = line.partition(" ")
            marks[name] = float(value)
    if len(marks) != 2:
        raise AssertionError(f"no start or end mark in {log}: {log.read_text()[-2000:]}")
    return marks[END_MARK] - marks[START_MARK]


def last_line(log: Path) -> str:
    """The last line the launcher wrote, the end mark left out."""
    lines = [x for x in log.read_text().strip().splitlines() if not x.startswith(END_MARK)]
    return lines[-1] if lines else ""

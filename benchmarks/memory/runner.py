"""Start the 2 ranks of one ``benchmarks/memory.py`` run and collect what they wrote.

Each run is a fresh pair of processes (peak RSS is per process), launched as torchrun would
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``) with ``OMP_NUM_THREADS=1`` and gloo on loopback. A rank that fails (the capped
case) leaves its partner waiting in a collective: the partner is killed, by pid, a few seconds
after the first rank has reported.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORKER = HERE / "worker.py"
GRACE_S = 20.0


@dataclass(frozen=True, kw_only=True)
class Run:
    """One measurement: a variant at a size, maybe under a cap."""

    variant: str
    """``ddp-torch``, ``fsdp-torch``, ``ddp``, ``fsdp``, ``auto``, ``paired-fsdp`` or ``fill``."""
    width: int
    """Features of each Linear block."""
    blocks: int
    """Number of Linear+ReLU blocks."""
    steps: int = 5
    """Timed optimizer steps."""
    warmup: int = 1
    """Steps before them (not timed; their memory counts)."""
    batch: int = 8
    """Rows per rank per step."""
    cap_gib: float = 0.0
    """``RLIMIT_DATA`` of each rank in GiB (0: none)."""
    cap_kind: str = "data"
    """``data`` (``RLIMIT_DATA``) or ``as`` (``RLIMIT_AS``)."""
    mmap_threshold: int = 0
    """glibc's ``M_MMAP_THRESHOLD`` for each rank (0: glibc's dynamic default)."""
    world_size: int = 2
    """Processes."""

    def args(self) -> list[str]:
        """The worker's options."""
        out = [
            f"--variant={self.variant}",
            f"--width={self.width}",
            f"--blocks={self.blocks}",
            f"--steps={self.steps}",
            f"--warmup={self.warmup}",
            f"--batch={self.batch}",
        ]
        if self.cap_gib:
            out += [f"--cap-gib={self.cap_gib}", f"--cap-kind={self.cap_kind}"]
        if self.mmap_threshold:
            out.append(f"--mmap-threshold={self.mmap_threshold}")
        return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(run: Run, timeout_s: float = 900.0) -> list[dict[str, Any]]:
    """Run both ranks; their reports by rank (a rank that wrote nothing: ``{"error": ...}``)."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="mg-memory-") as tmp:
        procs = []
        for rank in range(run.world_size):
            env = {
                **os.environ,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(run.world_size),
                "LOCAL_WORLD_SIZE": str(run.world_size),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "OMP_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1",
                "GLOO_SOCKET_IFNAME": "lo",
                "MULTIGPU_WATCHDOG": os.environ.get("MULTIGPU_WATCHDOG", "1"),
            }
            out = Path(tmp) / f"rank{rank}.json"
            cmd = [sys.executable, str(WORKER), *run.args(), f"--out={out}"]
            log = open(Path(tmp) / f"rank{rank}.log", "w")  # noqa: SIM115 (closed below)
            procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=log), out, log))
        deadline = time.monotonic() + timeout_s
        first_done: float | None = None
        while any(p.poll() is None for p, _, _ in procs):
            now = time.monotonic()
            if first_done is None and any(p.poll() is not None for p, _, _ in procs):
                first_done = now
            if now > deadline or (first_done is not None and now - first_done > GRACE_S):
                for p, _, _ in procs:
                    if p.poll() is None:
                        p.kill()  # by pid: only the workers this run started
                        p.wait()
                break
            time.sleep(0.2)
        results = []
        for rank, (p, out, log) in enumerate(procs):
            log.close()
            if out.exists():
                results.append(json.loads(out.read_text()))
                continue
            tail = (Path(tmp) / f"rank{rank}.log").read_text()[-2000:]
            last = next((ln for ln in reversed(tail.splitlines()) if ln.strip()), "")
            error = f"no report (exit {p.returncode}): {last}"
            results.append({"rank": rank, "variant": run.variant, "error": error, "log": tail})
        for rank, result in enumerate(results):
            log_text = (Path(tmp) / f"rank{rank}.log").read_text()
            said = [ln.strip() for ln in log_text.splitlines() if "strategy auto chose" in ln]
            if said:
                result["auto_line"] = said[0]
        return results

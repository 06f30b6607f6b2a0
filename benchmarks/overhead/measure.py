"""Running one measurement of ``benchmarks/overhead.py``: a training job, an import, a launch.

Each function starts fresh processes and returns what they reported; ``overhead.py`` interleaves
the calls and does the statistics.

Environment variables read: none directly; every child gets the caller's environment with
``OMP_NUM_THREADS=1``, ``MKL_NUM_THREADS=1`` and the ``BENCH_*`` settings of ``workload.py``, and
without ``PYTHONDONTWRITEBYTECODE`` (Python's default: imports use and write ``__pycache__``; with
it set, an editable install such as this repo's recompiles every module at every import).
"""

from __future__ import annotations

import json
import os
import platform
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BIN = Path(sys.executable).parent
RUN_TIMEOUT_S = 600


@dataclass(frozen=True, kw_only=True)
class Job:
    """One way of running the same training: a launcher command and a worker script."""

    key: str
    """Short name used in tables and JSON."""
    title: str
    """What it is, for the table."""
    script: str
    """Worker script in benchmarks/overhead/."""
    launcher: str
    """``torchrun``, ``torchrun-standalone`` or ``multigpu``."""
    env: tuple[tuple[str, str], ...] = ()
    """Variables set for this command on top of the common ones."""

    def command(self, port: int) -> list[str]:
        """The command line, with a free ``port`` for torchrun's static rendezvous."""
        script = str(HERE / self.script)
        if self.launcher == "multigpu":  # picks its own free port (--standalone)
            return [str(BIN / "multigpu"), "run", "--cpu", "2", script]
        if self.launcher == "torchrun-standalone":
            return [str(BIN / "torchrun"), "--nproc-per-node", "2", "--standalone", script]
        # A fixed default port (29500) would collide with other jobs on a shared machine.
        return [str(BIN / "torchrun"), "--nproc-per-node", "2", f"--master-port={port}", script]

    def shown(self) -> str:
        """The command as a user types it (relative paths, the port left out)."""
        script = f"benchmarks/overhead/{self.script}"
        env = "".join(f"{k}={v} " for k, v in self.env)
        if self.launcher == "multigpu":
            return f"{env}multigpu run --cpu 2 {script}"
        if self.launcher == "torchrun-standalone":
            return f"{env}torchrun --nproc-per-node 2 --standalone {script}"
        return f"{env}torchrun --nproc-per-node 2 {script}"


STEP_JOBS = (
    Job(key="ddp", title="(a) hand-written DDP", script="ddp_raw.py", launcher="torchrun"),
    Job(key="multigpu", title="(b) multigpu", script="multigpu_job.py", launcher="multigpu"),
    Job(
        key="multigpu, no watchdog",
        title="(b) multigpu, MULTIGPU_WATCHDOG=0",
        script="multigpu_job.py",
        launcher="multigpu",
        env=(("MULTIGPU_WATCHDOG", "0"),),
    ),
    Job(key="accelerate", title="(c) Accelerate", script="accelerate_job.py", launcher="torchrun"),
    Job(key="fabric", title="(d) Lightning Fabric", script="fabric_job.py", launcher="torchrun"),
)
"""The four frameworks, and multigpu without its hang watchdog (no collective recorder around
``ctx.backward``, no watchdog thread); the first is the baseline of every ratio."""

LAUNCH_JOBS = (
    Job(key="torchrun", title="torchrun + DDP", script="ddp_raw.py", launcher="torchrun"),
    Job(key="multigpu run", title="multigpu run", script="multigpu_job.py", launcher="multigpu"),
    Job(
        key="torchrun + multigpu",
        title="torchrun + multigpu script",
        script="multigpu_job.py",
        launcher="torchrun",
    ),
    Job(
        key="multigpu run + DDP",
        title="multigpu run + DDP script",
        script="ddp_raw.py",
        launcher="multigpu",
    ),
    Job(
        key="torchrun --standalone",
        title="torchrun --standalone + DDP",
        script="ddp_raw.py",
        launcher="torchrun-standalone",
    ),
    Job(
        key="multigpu run, store per attempt",
        title="multigpu run, a store per attempt",
        script="multigpu_job.py",
        launcher="multigpu",
        env=(("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1"),),
    ),
)
"""Launch to first step; the first is the baseline. The others split multigpu's difference: the
library's share (same launcher), the launcher's (same script), the rendezvous kind's (c10d,
which ``multigpu run`` uses on one node through ``--standalone``, vs torchrun's default static),
and that of a store per attempt (what ``multigpu run`` sets with ``--max-restarts`` or several
nodes, against a restart race: then rank 0's worker hosts a new store, and a rank 1 that
connects before it listens is refused and retries about half a second later)."""

IMPORTS = ("torch", "multigpu", "accelerate", "lightning.fabric")
"""Modules timed at import; ``torch`` is the baseline."""

_IMPORT_CODE = (
    "import sys, time\n"
    "t = time.perf_counter()\n"
    "__import__(sys.argv[1])\n"
    "sys.stdout.write(repr(time.perf_counter() - t))\n"
)


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every child process (see the module docstring)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.update(extra or {})
    return env


PAIRED_JOB = Job(
    key="paired", title="all four, taking turns", script="paired.py", launcher="multigpu"
)
"""The four frameworks side by side in the same processes (see paired.py)."""


def run_job(job: Job, settings: dict[str, str]) -> dict[str, Any]:
    """Run ``job`` once with ``BENCH_*`` ``settings``; return rank 0's result plus the launch time.

    ``launch_s`` is from just before the command starts to the end of the first optimizer step
    on rank 0 (both wall clocks of this machine), split into ``to_worker_s`` (until rank 0's
    process started) and ``worker_setup_s`` (its imports and set-up until its loop started);
    ``run_s`` is the command's whole duration and ``cpu_total_s`` the CPU time of all its
    processes, which the machine's other load disturbs much less than wall time.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result, started, ended = launch(job, settings)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # Every process of the command (launcher, agent, workers) once reaped, start to exit.
    result["cpu_total_s"] = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    result["launch_s"] = result["first_step_wall"] - started
    result["run_s"] = ended - started
    # Where the launch time goes: the launcher until rank 0's process exists, then the worker's
    # imports and set-up until its training loop starts.
    result["to_worker_s"] = result["process_start_wall"] - started
    result["worker_setup_s"] = result["loop_start_wall"] - result["process_start_wall"]
    times = result.pop("step_times")
    cpu = result.pop("cpu_times")
    result["step_median_s"] = statistics.median(times) if times else float("nan")
    result["cpu_median_s"] = statistics.median(cpu) if cpu else float("nan")
    result["timed_steps"] = len(times)
    return result


def launch(job: Job, settings: dict[str, str]) -> tuple[dict[str, Any], float, float]:
    """Run ``job`` once; rank 0's JSON result, and the command's start and end (``time.time``)."""
    with tempfile.TemporaryDirectory(prefix="overhead-") as tmp:
        out = Path(tmp) / "result.json"
        log = Path(tmp) / "log.txt"
        env = child_env({**settings, **dict(job.env), "BENCH_OUT": str(out)})
        command = job.command(free_port())
        with open(log, "w") as sink:
            started = time.time()
            # Its own session: a run past the timeout is stopped with its workers, which the
            # launcher alone would leave behind.
            child = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                code = child.wait(timeout=RUN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                tail = log.read_text(errors="replace")[-3000:]
                raise RuntimeError(
                    f"{' '.join(command)} ran past {RUN_TIMEOUT_S} s; last output:\n{tail}"
                ) from None
            ended = time.time()
        if code != 0 or not out.exists():
            tail = log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{' '.join(command)} exited {code}; last output:\n{tail}")
        result: dict[str, Any] = json.loads(out.read_text())
    return result, started, ended


def extra_work(settings: dict[str, str]) -> dict[str, Any]:
    """Run extra_work.py in a fresh interpreter; its JSON (microseconds per piece)."""
    done = subprocess.run(
        [sys.executable, str(HERE / "extra_work.py")],
        cwd=ROOT,
        env=child_env(settings),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"extra_work.py failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def time_import(module: str) -> tuple[float, float]:
    """Import ``module`` in a fresh interpreter: (seconds inside it, seconds of the process)."""
    env = child_env()
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_CODE, module],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"import {module} failed:\n{done.stderr[-3000:]}")
    return float(done.stdout.strip()), wall


def versions() -> dict[str, str]:
    """Versions of Python, the kernel and the packages compared (package metadata: no import)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": sys.version.split()[0], "kernel": platform.release()}
    for name in ("torch", "multigpu", "accelerate", "lightning", "numpy"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found

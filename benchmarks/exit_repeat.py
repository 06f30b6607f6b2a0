"""Run a finished job many times and count how its exits end: the teardown abort hunt.

Each run is ``multigpu run --cpu 2 benchmarks/exit_repeat/job.py DIR`` (DDP, a few steps, a
synchronous and a background checkpoint, then a normal exit), or with ``--nodes 2`` two launchers
on this host joined by a c10d rendezvous (``--nnodes 2``, one worker each). A run is counted as

- ok: every launcher exited 0 and printed the job's last line;
- abort: a launcher's output has ``terminate called`` or a worker ended by SIGABRT;
- hang: a launcher still ran after ``--timeout`` seconds (killed, with its session);
- other: any other exit code (the first lines are kept in the report).

Several runs go at once (``--jobs``): more load, more chances for a teardown race.

Usage:
    python benchmarks/exit_repeat.py --runs 200 --jobs 2 [--nodes 2] [--keep-going]

Prints one line per bad run and a summary; exits 1 if any run was not ok.

Environment variables read: none (the children get ``PYTHONPATH=src`` and
``GLOO_SOCKET_IFNAME=lo``).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "benchmarks" / "exit_repeat" / "job.py"
ABORT_WORDS = ("terminate called", "Signal 6 (SIGABRT)", "SIGABRT", "exitcode  : -6")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _commands(nodes: int, out: Path) -> list[list[str]]:
    base = [sys.executable, "-m", "multigpu", "run", "--timeout", "20"]
    if nodes == 1:
        return [[*base, "--cpu", "2", str(JOB), str(out)]]
    port = _free_port()
    return [
        [
            *base,
            "--cpu",
            "1",
            "--nnodes",
            str(nodes),
            "--node-rank",
            str(rank),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            f"exit-repeat-{port}",
            "--local-addr",
            "127.0.0.1",
            str(JOB),
            str(out),
        ]
        for rank in range(nodes)
    ]


def one_run(index: int, nodes: int, timeout: float, workdir: Path) -> tuple[str, float, str]:
    """Run the job once; return (outcome, seconds, detail)."""
    out = workdir / f"run-{index}"
    procs = [
        subprocess.Popen(
            cmd,
            cwd=workdir,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for cmd in _commands(nodes, out)
    ]
    deadline = time.monotonic() + timeout
    texts, codes, hung = [], [], False
    for proc in procs:
        try:
            text, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            hung = True
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher's session: it and its workers
            text, _ = proc.communicate()
        texts.append(text)
        codes.append(proc.returncode)
    joined = "\n".join(texts)
    seconds = time.monotonic() - deadline + timeout
    detail = f"exit codes {codes}, {seconds:.1f} s"
    if any(w in joined for w in ABORT_WORDS):
        lines = [ln for ln in joined.splitlines() if any(w in ln for w in ABORT_WORDS)]
        return "abort", seconds, f"{detail}: {lines[0].strip()}\n{joined}"
    if hung:
        return "hang", seconds, f"{detail}\n{joined}"
    if any(codes) or joined.count("loss ") != 1:
        return "other", seconds, f"{detail}\n{joined}"
    return "ok", seconds, detail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="how many runs (default 200)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (default 2)")
    parser.add_argument("--nodes", type=int, default=1, choices=(1, 2), help="launchers a run")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds before a hang")
    parser.add_argument("--log", type=Path, help="write every bad run's whole output here")
    args = parser.parse_args(argv)
    counts: collections.Counter[str] = collections.Counter()
    times: list[float] = []
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="exit-repeat-") as tmp,
        concurrent.futures.ThreadPoolExecutor(args.jobs) as pool,
    ):
        futures = {
            pool.submit(one_run, i, args.nodes, args.timeout, Path(tmp)): i
            for i in range(args.runs)
        }
        for future in concurrent.futures.as_completed(futures):
            outcome, seconds, detail = future.result()
            counts[outcome] += 1
            head = detail.splitlines()[0]
            times.append(seconds)
            if outcome != "ok":
                print(f"run {futures[future]}: {outcome}: {head}", flush=True)
                if args.log:
                    with args.log.open("a") as fh:
                        fh.write(f"==== run {futures[future]}: {outcome}\n{detail}\n")
            done = sum(counts.values())
            if done % 20 == 0:
                print(f"... {done} runs: {dict(counts)}", flush=True)
    total = time.monotonic() - started
    print(
        f"{args.runs} runs ({args.nodes} node(s), {args.jobs} at once) in {total:.0f} s: "
        f"ok {counts['ok']}, abort {counts['abort']}, hang {counts['hang']}, "
        f"other {counts['other']}; per run median {sorted(times)[len(times) // 2]:.1f} s, "
        f"max {max(times):.1f} s"
    )
    return 0 if counts["ok"] == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())

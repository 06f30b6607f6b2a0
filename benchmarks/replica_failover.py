"""kill -9 of one node's worker: replica groups (torchft) against torchrun's elastic restart.

Two test hosts (network namespaces on a private bridge, root only: ``multigpu.testing.hosts``),
one worker each, run the same job (``tests/replicas/scripts/job.py``: SGD + momentum, 200 steps,
``JOB_SLEEP`` s per step, a checkpoint every 20 steps) two ways:

- ``replicas``: ``multigpu run --replicas 2 --replica-group G --lighthouse node0:29510`` per node
  (one replica group each); node1's worker is SIGKILLed at step ``--kill-at``, its agent
  restarts it and it heals from node0;
- ``elastic``: ``multigpu run --nnodes 2`` (c10d rendezvous on node0, ``--max-restarts 3``);
  node1's worker is SIGKILLed at the same step, the agents restart both workers, which resume
  from the newest checkpoint.

Reported per way: node0's longest pause between two steps, the time from the kill until the
killed worker stepped again (``back``), and the steps run twice (``lost``: positions of the
global order trained again after the kill, as the job's step files record them).

Usage (root):
    python benchmarks/replica_failover.py [--runs 2] [--sleep 0.04] [--kill-at 60] [--timeout 30]

Environment variables read: none (the hosts get ``PYTHONPATH=src``, one thread per process).
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from multigpu.testing.hosts import Host, hosts_available, virtual_hosts  # noqa: E402

JOB = ROOT / "tests" / "replicas" / "scripts" / "job.py"
EPOCHS = 4


def _env(sleep: float, checkpoint_every: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "GLOO_SOCKET_IFNAME"}
    env.update(
        PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
        JOB_SLEEP=str(sleep), JOB_CKPT_EVERY=str(checkpoint_every),
    )  # fmt: skip
    return env


def _steps(path: Path) -> list[tuple[float, int]]:
    if not path.exists():
        return []
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return [(float(t), int(p)) for t, p in rows]


def _argv(way: str, host: Host, i: int, node0: Host, out: Path, timeout: float) -> list[str]:
    common = ["--iface", host.interface, "--cpu", "1", "--timeout", f"{timeout:g}"]
    if way == "replicas":
        own = ["--replicas", "2", "--replica-group", str(i), "--lighthouse", f"{node0.name}:29510"]
    else:
        own = ["--nnodes", "2", "--node-rank", str(i), "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"{node0.name}:29400", "--rdzv-id", "bench",
               "--max-restarts", "3"]  # fmt: skip
    return [sys.executable, "-m", "multigpu", "run", *own, *common, str(JOB), str(out), str(EPOCHS)]


def one_run(way: str, sleep: float, kill_at: int, timeout: float) -> dict[str, float]:
    """Run ``way`` once on two fresh hosts; the figures of node0 and of the killed worker."""
    out = Path(tempfile.mkdtemp(prefix=f"failover-{way}-"))
    tag0, tag1 = ("0-0", "1-0") if way == "replicas" else ("plain-0", "plain-1")
    with virtual_hosts(2) as (node0, node1):
        procs = []
        for i, host in enumerate((node0, node1)):
            log = (out / f"node{i}.log").open("wb")
            procs.append(host.run(_argv(way, host, i, node0, out, timeout), _env(sleep, 20),
                                  cwd=out, stdout=log, stderr=subprocess.STDOUT))  # fmt: skip
        deadline = time.monotonic() + 300
        while len(_steps(out / f"steps-{tag1}")) < kill_at:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"{way}: the job did not reach step {kill_at}; see {out}")
            time.sleep(0.02)
        killed_at = time.time()
        os.kill(int((out / f"pid-{tag1}-0").read_text()), signal.SIGKILL)
        codes = [p.wait(timeout=300) for p in procs]
    if any(codes):
        raise RuntimeError(f"{way}: exit codes {codes}; see {out}")
    steps0 = _steps(out / f"steps-{tag0}")
    after = [t for t, _ in _steps(out / f"steps-{tag1}") if t > killed_at]
    seen: set[int] = set()
    lost = 0
    for _, position in steps0:
        lost += position in seen
        seen.add(position)
    return {
        "pause": max(b[0] - a[0] for a, b in itertools.pairwise(steps0)),
        "back": (after[0] - killed_at) if after else float("nan"),
        "lost": float(lost),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="runs of each way, interleaved (2)")
    parser.add_argument("--sleep", type=float, default=0.04, help="seconds per step (0.04)")
    parser.add_argument("--kill-at", type=int, default=60, help="node1's steps before the kill")
    parser.add_argument("--timeout", type=float, default=30, help="multigpu --timeout (30)")
    args = parser.parse_args()
    reason = hosts_available()
    if reason is not None:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    results: dict[str, list[dict[str, float]]] = {"replicas": [], "elastic": []}
    for _ in range(args.runs):
        for way in results:
            figures = one_run(way, args.sleep, args.kill_at, args.timeout)
            print(way, " ".join(f"{k}={v:.2f}" for k, v in figures.items()), flush=True)
            results[way].append(figures)
    print("\n| way | node0's longest pause | killed worker stepping again | steps run twice |")
    print("|---|---|---|---|")
    for way, runs in results.items():
        cells = [statistics.median(r[k] for r in runs) for k in ("pause", "back", "lost")]
        print(f"| {way} | {cells[0]:.2f} s | {cells[1]:.2f} s | {cells[2]:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

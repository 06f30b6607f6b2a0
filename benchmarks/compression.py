"""Gradient compression on a slow link: the built-in job on 2 test hosts, with and without it.

Two "machines" (``multigpu.testing.hosts.virtual_hosts(2)``: network namespaces on a private
bridge) each run ``multigpu train --cpu 1 --nnodes 2 ... --compression X``: 2 nodes x 1 process,
gloo over each host's ``eth0``. The link is throttled with a token bucket on each host's
``eth0`` (``tc qdisc replace dev eth0 root tbf rate R burst 32kbit latency 400ms``; ``netem``
is not in this kernel), which limits what each host sends. For every link rate and every
compression (none, bf16, fp16, powersgd), repeated and interleaved (the order rotates each
round, so the machine's noise hits all alike), it records the job's median optimizer-step time
(``step_ms_median`` of ``metrics.json``), the final test accuracy, the bytes each host sent
(``/proc/net/dev`` in its namespace: gradients plus rendezvous, evaluation and checks) and the
wall time, and prints medians with the step-time ratio to ``none`` on the same link.

The digits CNN has 38,282 float32 parameters: 153 KB of gradients per step; a 2-process
all-reduce sends about that much from each host (two halves: reduce-scatter, all-gather).

Needs root (namespaces, tc). Everything it creates (namespaces, bridge, processes, qdiscs with
the namespaces) is removed when it ends, also on errors.

Run:  python benchmarks/compression.py [--rates unlimited,100mbit,20mbit] [--repeats 3]
          [--epochs 12] [--json FILE] [--keep DIR]

Environment variables read: none (the jobs get this process's environment, with
``OMP_NUM_THREADS=1`` and without ``GLOO_SOCKET_IFNAME``/``MULTIGPU_TIMEOUT``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from multigpu.strategies.compression import COMPRESSIONS
from multigpu.testing.hosts import Host, hosts_available, virtual_hosts

PORT = 29400
"""First rendezvous port on node0 (each run takes the next: no wait for a closed socket)."""

RUN_TIMEOUT = 900.0
"""Seconds one job may take before its processes are killed and the benchmark stops."""


def shell(host: Host, argv: list[str], *, check: bool = True) -> str:
    """Run ``argv`` inside ``host``; return its stdout (raise on failure when ``check``)."""
    proc = host.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} on {host.name} failed: {err.strip()}")
    return str(out)


def throttle(host: Host, rate: str) -> None:
    """Limit what ``host`` sends on its eth0 to ``rate`` (``unlimited``: remove the limit)."""
    shell(host, ["tc", "qdisc", "del", "dev", host.interface, "root"], check=False)
    if rate != "unlimited":
        shell(host, ["tc", "qdisc", "replace", "dev", host.interface, "root", "tbf", "rate",
                     rate, "burst", "32kbit", "latency", "400ms"])  # fmt: skip


def sent_bytes(host: Host) -> int:
    """Bytes ``host`` has sent on its eth0 (``/proc/net/dev`` is per network namespace)."""
    for line in shell(host, ["cat", "/proc/net/dev"]).splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == host.interface:
            return int(counters.split()[8])
    raise RuntimeError(f"{host.interface} not in /proc/net/dev of {host.name}")


def job_env() -> dict[str, str]:
    """This environment for the jobs: one thread per process, gloo free to pick eth0."""
    env = dict(os.environ)
    env.pop("GLOO_SOCKET_IFNAME", None)  # --iface eth0 sets it
    env.pop("MULTIGPU_TIMEOUT", None)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


def run_job(
    hosts: list[Host], compression: str, epochs: int, out: Path, port: int
) -> dict[str, Any]:
    """One 2-node run of ``multigpu train``; its metrics plus the bytes each host sent."""
    out.mkdir(parents=True)
    argv = [sys.executable, "-m", "multigpu", "train", "--cpu", "1", "--nnodes", "2",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{hosts[0].name}:{port}",
            "--rdzv-id", f"bench{port}", "--iface", hosts[0].interface,
            "--epochs", str(epochs), "--compression", compression, "--progress", "lines",
            "--out", str(out)]  # fmt: skip
    before = [sent_bytes(h) for h in hosts]
    started = time.perf_counter()
    procs = []
    for host in hosts:
        with (out / f"{host.name}.log").open("wb") as log:
            procs.append(host.run(argv, job_env(), cwd=out, stdout=log, stderr=subprocess.STDOUT))
    try:
        codes = [p.wait(timeout=RUN_TIMEOUT) for p in procs]
    except subprocess.TimeoutExpired:
        for host in hosts:
            host.kill_all()
        raise RuntimeError(f"{compression} ran over {RUN_TIMEOUT:.0f} s; logs in {out}") from None
    wall = time.perf_counter() - started
    sent = [sent_bytes(h) - b for h, b in zip(hosts, before, strict=True)]
    if codes != [0, 0]:
        tail = (out / f"{hosts[0].name}.log").read_text()[-2000:]
        raise RuntimeError(f"{compression}: exit codes {codes}; logs in {out}:\n{tail}")
    metrics = json.loads((out / "metrics.json").read_text())
    steps = epochs * steps_per_epoch(metrics)
    return {
        "compression": metrics["compression"],
        "step_ms": metrics["step_ms_median"],
        "accuracy": metrics["test_accuracy"],
        "sha": metrics["param_sha256"],
        "sent_kb_per_step": statistics.mean(sent) / steps / 1000,
        "wall_s": wall,
    }


def steps_per_epoch(metrics: dict[str, Any]) -> int:
    """Optimizer steps per epoch of the digits job (1437 training samples, last batch dropped)."""
    return 1437 // int(metrics["batch_size"])


def summarise(rows: list[dict[str, Any]], rates: list[str]) -> list[dict[str, Any]]:
    """Medians per (rate, compression), with the step-time ratio to ``none`` on that link."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[(row["rate"], row["compression"])].append(row)
    table = []
    for rate in rates:
        base = statistics.median(r["step_ms"] for r in groups[(rate, "none")])
        for name in COMPRESSIONS:
            runs = groups[(rate, name)]
            step = statistics.median(r["step_ms"] for r in runs)
            accuracies = sorted({r["accuracy"] for r in runs})
            table.append(
                {
                    "rate": rate,
                    "compression": name,
                    "step_ms": round(step, 2),
                    "vs_none": round(step / base, 3),
                    "sent_kb_per_step": round(
                        statistics.median(r["sent_kb_per_step"] for r in runs), 1
                    ),
                    "accuracy": accuracies,
                    "same_weights": len({r["sha"] for r in runs}) == 1,
                    "wall_s": round(statistics.median(r["wall_s"] for r in runs), 1),
                    "runs": len(runs),
                }
            )
    return table


def print_table(table: list[dict[str, Any]]) -> None:
    """The summary as a Markdown table."""
    print("| link (each host's egress) | compression | step time (median) | vs none | "
          "sent per step per host | test accuracy | job wall time |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for row in table:
        accuracy = " / ".join(f"{a:.4f}" for a in row["accuracy"])
        print(
            f"| {row['rate']} | {row['compression']} | {row['step_ms']:.2f} ms | "
            f"{row['vs_none']:.3f}x | {row['sent_kb_per_step']:.1f} KB | {accuracy} | "
            f"{row['wall_s']:.1f} s |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rates",
        default="unlimited,100mbit,20mbit",
        help="link rates in tc syntax, comma-separated (default: %(default)s)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs of each combination (3)")
    parser.add_argument("--epochs", type=int, default=12, help="epochs of each job (12)")
    parser.add_argument("--json", help="also write every run and the summary to this file")
    parser.add_argument("--keep", help="keep each run's logs and metrics here (default: removed)")
    args = parser.parse_args()
    reason = hosts_available()
    if reason is not None:
        print(f"compression benchmark: cannot create test hosts: {reason}", file=sys.stderr)
        return 2
    rates = [r.strip() for r in args.rates.split(",") if r.strip()]
    rows: list[dict[str, Any]] = []
    port = PORT
    with ExitStack() as stack:
        if args.keep:
            runs_dir = Path(args.keep)
            runs_dir.mkdir(parents=True, exist_ok=True)
        else:
            runs_dir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        hosts = stack.enter_context(virtual_hosts(2))
        for round_ in range(args.repeats):
            for rate in rates:
                for host in hosts:
                    throttle(host, rate)
                shift = (round_ + rates.index(rate)) % len(COMPRESSIONS)
                for name in COMPRESSIONS[shift:] + COMPRESSIONS[:shift]:
                    port += 1
                    out = runs_dir / f"r{round_}-{rate}-{name}"
                    row = {"rate": rate, "round": round_, **run_job(hosts, name, args.epochs,
                                                                     out, port)}  # fmt: skip
                    rows.append(row)
                    print(
                        f"round {round_} {rate:>9} {name:>8}: step {row['step_ms']:.2f} ms, "
                        f"acc {row['accuracy']:.4f}, {row['sent_kb_per_step']:.1f} KB/step "
                        f"sent per host, {row['wall_s']:.1f} s",
                        flush=True,
                    )
    if args.keep:
        print(f"logs and metrics of every run: {args.keep}")
    table = summarise(rows, rates)
    print()
    print_table(table)
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": rows, "summary": table}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

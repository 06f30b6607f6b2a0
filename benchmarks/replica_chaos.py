"""Replica groups under seeded kill schedules: every run ends exact, or in one line — never off.

``python benchmarks/replica_chaos.py [--seeds 0:20] [--nodes 1|2] [--cpu N] [--out DIR]`` runs
each seed's schedule
(``tests/replicas/chaos.py``: a loop shape, an LR schedule, ddp or fsdp inside the groups, and
one to three kills: a worker, a worker during a checkpoint save, a group's launcher, the same
group twice, both groups at once) under ``multigpu run --replicas 2 --cpu N`` (``--nodes 2``: one
group on each of two test hosts, network namespaces joined by a bridge), compares every
group's final parameters with the uninterrupted run of the same script, and prints a table:
schedule, outcome, worst difference, the untouched group's longest pause, wall time. Exit code 1
when any run is OFF (a wrong result or writer after exit 0).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.replicas.chaos import draw, judge, run, uninterrupted


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0:20", help="first:last (exclusive), e.g. 0:20")
    parser.add_argument("--out", type=Path, default=None, help="keep the runs' files here")
    parser.add_argument(
        "--nodes",
        type=int,
        choices=(1, 2),
        default=1,
        help="2: one group per test host (network namespaces; root)",
    )
    parser.add_argument("--cpu", type=int, default=1, help="processes per group")
    args = parser.parse_args()
    first, last = (int(x) for x in args.seeds.split(":"))
    root = args.out or Path(tempfile.mkdtemp(prefix="replica-chaos-"))
    references: dict[tuple[str, str, str], dict] = {}
    rows, off = [], 0
    print(
        "| seed | loop / LR / strategy | kills | outcome | worst difference | untouched group's "
        "longest pause | wall |",
        flush=True,
    )
    print("|---|---|---|---|---|---|---|", flush=True)
    for seed in range(first, last):
        schedule = draw(seed)
        key = (schedule.shape, schedule.lr, schedule.strategy)
        if key not in references:
            references[key] = uninterrupted(*key, root / f"ref-{'-'.join(key)}", cpu=args.cpu)
        out = root / f"seed-{seed}"
        shutil.rmtree(out, ignore_errors=True)
        done = run(schedule, out, nodes=args.nodes, cpu=args.cpu)
        outcome = judge(done, references[key], out)
        off += outcome.verdict == "OFF"
        worst = f"{outcome.worst:.1e}" if outcome.worst is not None else "-"
        pause = f"{outcome.pause_s:.2f} s" if outcome.pause_s is not None else "-"
        kills = " ".join(map(str, schedule.kills))
        row = (
            f"| {seed} | {'/'.join(key)} | {kills} | {outcome.verdict} | {worst} | {pause} | "
            f"{outcome.wall_s:.0f} s |"
        )
        rows.append(row)
        print(row, flush=True)
        for note in outcome.notes:
            print(f"|   | note: {note} | | | | | |", flush=True)
        if outcome.verdict != "exact":
            tail = outcome.err.strip().splitlines()[-3:]
            print("\n".join(f"    {line}" for line in tail), file=sys.stderr, flush=True)
    print(
        f"\n{len(rows)} schedules: {sum('| exact |' in r for r in rows)} exact, "
        f"{sum('| ended |' in r for r in rows)} ended in one line, {off} off; files in {root}"
    )
    return 1 if off else 0


if __name__ == "__main__":
    raise SystemExit(main())

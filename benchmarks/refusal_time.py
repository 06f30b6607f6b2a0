"""How long the command line takes to refuse bad input (issue 17: one line, exit 2, < 3 s).

Each bad flag and bad variable of ``tests/launch/test_cli_errors.py`` is run on its own,
one after another (not concurrently, as the test does), ``--repeats`` times; the median wall time
of each is printed beside the baseline measured in the same run: a Python that only imports
torch (``python -c "import torch"``), the floor of any launcher that reads torchrun's options.

Run:  python benchmarks/refusal_time.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.launch.test_cli_errors import CASES, ENV  # noqa: E402 (the one list of bad input)

MORE_TRAIN_FLAGS = {  # issue 17's list; refused by the job's parser (tests/examples)
    f"train{flag}-{value}": ["train", "--cpu", "2", flag, value]
    for flag, value in [
        ("--batch-size", "-1"), ("--lr", "nan"), ("--accumulation-steps", "0"),
        ("--strategy", "bogus"), ("--precision", "8"), ("--checkpoint-every", "0"),
        ("--keep-checkpoints", "-1"),
    ]
}  # fmt: skip


def timed(argv: list[str], cwd: str, env: dict[str, str]) -> tuple[float, int]:
    began = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, check=False)
    return time.perf_counter() - began, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each case (3)")
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    baseline = [sys.executable, "-c", "import torch"]
    rows: list[tuple[str, float, int]] = []
    with tempfile.TemporaryDirectory() as cwd, socket.socket() as busy:
        Path(cwd, "s.py").write_text("raise SystemExit('must never run')\n")
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        floor = statistics.median(timed(baseline, cwd, env)[0] for _ in range(args.repeats))
        for name, case in {**CASES, **MORE_TRAIN_FLAGS}.items():
            argv = [sys.executable, "-m", "multigpu", *(a.replace("{port}", port) for a in case)]
            runs = [timed(argv, cwd, {**env, **ENV.get(name, {})}) for _ in range(args.repeats)]
            rows.append((name, statistics.median(t for t, _ in runs), max(c for _, c in runs)))
    print(f"baseline (import torch): {floor:.2f} s, median of {args.repeats}")
    print(f"{'case':28} {'seconds':>8} {'x baseline':>11} {'exit':>5}")
    for name, seconds, code in rows:
        print(f"{name:28} {seconds:8.2f} {seconds / floor:11.2f} {code:5d}")
    worst = max(rows, key=lambda r: r[1])
    print(f"slowest: {worst[0]} {worst[1]:.2f} s ({worst[1] / floor:.2f}x baseline); "
          f"every exit 2: {all(code == 2 for _, _, code in rows)}")  # fmt: skip


if __name__ == "__main__":
    main()

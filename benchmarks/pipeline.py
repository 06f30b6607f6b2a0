"""Tokens/s of the LM under pipeline (GPipe, 1F1B) beside DDP and FSDP, in one session.

Each strategy is one ``multigpu train --model lm --cpu 2`` run of the same model, data and
steps; the script prints tokens/s (from each run's metrics.json, training time only) and the
ratio to DDP's, and the pipeline's bubble line.

    python benchmarks/pipeline.py [--steps 100] [--processes 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

RUNS = {
    "ddp": ["--strategy", "ddp"],
    "fsdp": ["--strategy", "fsdp"],
    "pipeline gpipe": ["--strategy", "pipeline", "--schedule", "gpipe"],
    "pipeline 1f1b": ["--strategy", "pipeline", "--schedule", "1f1b"],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, options in RUNS.items():
            out = Path(tmp) / label.replace(" ", "-")
            command = [
                sys.executable,
                "-m",
                "multigpu",
                "train",
                "--model",
                "lm",
                "--cpu",
                str(args.processes),
                "--steps",
                str(args.steps),
                "--eval-every",
                str(args.steps),
                "--progress",
                "off",
                "--out",
                str(out),
                *options,
            ]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            metrics = json.loads((out / "metrics.json").read_text())
            results[label] = float(metrics["tokens_per_second"])
            bubble = [line for line in done.stdout.splitlines() if "bubble" in line]
            print(f"{label:>15}: {results[label]:8.0f} tokens/s  val loss {metrics['val_loss']}")
            for line in bubble:
                print(f"{'':>17}{line}")
    base = results["ddp"]
    print("ratio vs ddp: " + ", ".join(f"{k} {v / base:.2f}" for k, v in results.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``multigpu bench comm`` and ``bench scaling`` end to end: real launcher children, real gloo.

Each launch is a torchrun agent plus workers (4-8 s on 2 cores). The figures are not checked
for speed (a shared machine is noisy), only for what the formulas and the records make them.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from multigpu.common.host import usable_cores
from multigpu.diagnostics.bench.bandwidth import bus_factor
from multigpu.diagnostics.bench.splits import core_splits

TINY = Path(__file__).resolve().parent / "scripts" / "tiny.py"


def multigpu(argv: list[str], cwd: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, MULTIGPU_CACHE_DIR=str(cache))
    env.pop("PYTEST_CURRENT_TEST", None)
    return subprocess.run(
        [sys.executable, "-m", "multigpu", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_comm_measures_every_collective_with_nccl_tests_bandwidths(tmp_path: Path) -> None:
    argv = ["bench", "comm", "--cpu", "--nproc", "2", "--sizes", "1K,64K", "--json"]
    done = multigpu([*argv, "--iters", "5", "--warmup", "1"], tmp_path, tmp_path / "cache")
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["world_size"] == 2 and doc["backend"] == "gloo" and doc["iters"] == 5
    rows = doc["rows"]
    assert [(r["op"], r["size_bytes"]) for r in rows] == [
        (op, size)
        for op in ("all_reduce", "all_gather", "broadcast", "reduce_scatter")
        for size in (1024, 65536)
    ]
    for r in rows:
        assert r["correct"], r  # every rank checked the values it received
        assert r["time_us"] > 0 and r["count"] == r["size_bytes"] // 4
        seconds = r["time_us"] / 1e6
        assert r["algbw_gbps"] == pytest.approx(r["size_bytes"] / seconds / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * bus_factor(r["op"], 2))
    assert "all-reduce of the whole input" in doc["notes"]["reduce_scatter"]
    assert doc["command"][3:6] == ["run", "--cpu", "2"]


def test_scaling_runs_each_world_size_and_split_and_saves_the_fastest(tmp_path: Path) -> None:
    cache, out = tmp_path / "cache", tmp_path / "out"
    argv = ["bench", "scaling", str(TINY), "--nproc", "1,2", "--steps", "5", "--warmup", "2"]
    done = multigpu([*argv, "--cpu", "--json", "--out", str(out)], tmp_path, cache)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["samples_per_step"] == 32  # tiny.py's global batch, whatever the world size
    assert doc["device"] == "cpu" and doc["cores"] == usable_cores()
    scaling = doc["scaling"]
    assert [(r["processes"], r["threads"]) for r in scaling] == [(1, 1), (2, 1)]
    for r in scaling:
        assert r["error"] == "" and r["timed_steps"] == 5  # stopped after 2 + 5 steps
        assert r["samples_per_second"] == pytest.approx(32 * r["steps_per_second"])
    assert scaling[0]["speedup"] == 1.0
    assert scaling[1]["speedup"] == pytest.approx(
        scaling[1]["samples_per_second"] / scaling[0]["samples_per_second"]
    )
    assert scaling[1]["efficiency"] == pytest.approx(scaling[1]["speedup"] / 2)
    splits = {(r["processes"], r["threads"]): r["samples_per_second"] for r in doc["splits"]}
    assert list(splits) == core_splits(usable_cores())
    rec = doc["recommendation"]
    assert splits[(rec["processes"], rec["threads"])] == max(splits.values())
    (entry,) = json.loads((cache / "cpu_split.json").read_text())["entries"]
    assert entry["script"] == str(TINY) and entry["processes"] == rec["processes"]
    assert "finished all 100 epochs" not in done.stdout  # the recorder stopped the script
    with (out / "scaling.csv").open() as fh:
        table = [row["table"] for row in csv.DictReader(fh)]
    assert table == ["scaling"] * 2 + ["splits"] * len(splits)
    assert json.loads((out / "scaling.json").read_text())["scaling"] == scaling
    if importlib.util.find_spec("matplotlib") is not None:
        png = (out / "scaling.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) < 100_000

    # `--cpu auto` now launches the measured split for this script.
    dry = multigpu(["run", "--cpu", "auto", "--dry-run", str(TINY)], tmp_path, cache)
    assert dry.returncode == 0, dry.stderr
    threads = usable_cores() // rec["processes"]
    assert f"processes: {rec['processes']} per node, {threads} thread(s) each" in dry.stdout
    assert "the fastest split `multigpu bench scaling` measured for this script" in dry.stdout

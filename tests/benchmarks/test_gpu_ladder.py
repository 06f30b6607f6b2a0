"""The GPU ladder (``benchmarks/gpu_ladder.py``) at ``--tiny`` on the CPU, and the schedule of
``scripts/gpu-check`` that runs it (listed, not run: its dry run takes minutes)."""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
LADDER = ROOT / "benchmarks" / "gpu_ladder.py"
CHECK = ROOT / "scripts" / "gpu-check"


def _ladder(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    source = os.environ.get("PYTHONPATH", str(ROOT / "src"))  # this checkout's multigpu
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": source}
    return subprocess.run(
        [sys.executable, str(LADDER), "--tiny", "--device", "cpu", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def ladder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, str, str]:
    """One ladder of two rungs (eager, then compiled with aot_eager: no C++ compile) and the
    Float8 rung, which a CPU skips, appended to a JSON list that holds an earlier run."""
    out = tmp_path_factory.mktemp("ladder") / "gpu-ladder.json"
    out.write_text(json.dumps([{"earlier": "run"}]))
    done = _ladder(
        "--rungs",
        "eager,compile,float8",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--compile-backend",
        "aot_eager",
        "--budget",
        "100",
        "--out",
        str(out),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return (
        json.loads(out.read_text()),
        out.with_suffix(".md").read_text(),
        done.stdout + done.stderr,
    )


def test_the_ladder_appends_its_run_with_each_rungs_figures(ladder: tuple[Any, str, str]) -> None:
    runs, _, _ = ladder
    assert len(runs) == 2 and runs[0] == {"earlier": "run"}
    run = runs[1]
    assert run["device"] == "CPU" and run["world_size"] == 1 and run["precision"] == "32"
    assert run["config"]["layers"] == 2 and 100_000 < run["parameters"] < 200_000
    eager, compiled, float8 = run["rows"]
    for row, backend in ((eager, None), (compiled, "aot_eager")):
        assert row["status"] == "ok", row
        assert row["compile"] == backend
        assert row["steps"] == 2 and row["warmup_steps"] == 1
        assert row["tokens_per_s"] > 0 and row["step_s"] > 0 and row["first_step_s"] > 0
        assert row["peak_memory_bytes"] > 50 * 2**20 and row["peak_memory_of"] == "process max RSS"
        assert row["mfu"] is None and row["flops_per_token"] > 6 * 100_000
        assert math.isfinite(row["loss"]) and 0 < row["rung_s"] <= row["bound_s"] + 30
    assert eager["activation_checkpointing"] is None and not eager["float8"]
    assert float8["status"].startswith("skipped: no CUDA device")


def test_the_table_file_and_the_printout_show_every_rung(ladder: tuple[Any, str, str]) -> None:
    _, table, output = ladder
    assert "| FSDP (eager) |" in table and "| + compile |" in table
    assert "| + Float8 | | | | | | | skipped: no CUDA device" in table
    assert "(RSS)" in table and "n/a" in table  # CPU: RSS, no MFU
    assert "--compile-backend aot_eager" in table.splitlines()[0]
    assert table in output
    assert output.count("torch.compile: compiled 2 blocks in") == 1  # the compiled rung's own


def test_the_budget_ends_the_ladder_whatever_it_is_doing(tmp_path: Path) -> None:
    out = tmp_path / "l.json"
    # 5 s: a rung starts while 5 % of the budget is left, and a loaded machine spent 1 s of a
    # 1 s budget before the first rung (skipped, exit 0). The timed steps are fitted into the
    # rung's share; its warm-up is not: 10^6 warm-up steps outlast the budget on any machine.
    done = _ladder(
        "--rungs", "eager", "--warmup", "1000000", "--steps", "1", "--budget", "5",
        "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 124, done.stdout + done.stderr
    assert "gpu_ladder: the budget of 5 s ended during rung eager;" in done.stdout


def test_bad_options_are_one_line_and_exit_code_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(LADDER.parent))
    gpu_ladder = importlib.import_module("gpu_ladder")
    for argv, expected in (
        (["--rungs", "eager,turbo"], "--rungs 'eager,turbo': expected a comma list of eager, "),
        (["--budget", "0"], "--budget 0.0: expected a positive number"),
    ):
        with pytest.raises(SystemExit) as stopped:
            gpu_ladder.parse_args(argv)
        assert stopped.value.code == 2
        assert expected in capsys.readouterr().err


def _schedule(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(CHECK), *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **env},
    )


def test_gpu_check_is_well_formed_and_its_dry_run_runs_the_tiny_ladder_on_the_cpu() -> None:
    assert subprocess.run(["bash", "-n", str(CHECK)]).returncode == 0
    gpu, dry = _schedule("--list"), _schedule("--list", "--dry-run")
    assert gpu.returncode == 0 and dry.returncode == 0, gpu.stderr + dry.stderr
    assert _schedule("--list", GPU_CHECK_DRY_RUN="1").stdout == dry.stdout
    steps = [line.split()[0] for line in gpu.stdout.splitlines()]
    assert steps[0] == "ladder" and "GPU" in steps and "doctor" in steps
    ladder = [line for line in dry.stdout.splitlines() if "benchmarks/gpu_ladder.py" in line]
    assert len(ladder) == 1 and "--tiny --device cpu" in ladder[0]
    assert "--budget 130" in ladder[0] and "gpu-ladder.json" in ladder[0]
    assert "--tiny" not in gpu.stdout and "nvidia-smi" not in dry.stdout
    trains = [line for line in dry.stdout.splitlines() if "multigpu train" in line]
    assert len(trains) == 4 and all("--cpu 1" in line for line in trains)


def test_gpu_check_refuses_a_bad_budget_in_one_line() -> None:
    done = _schedule("--list", GPU_CHECK_BUDGET="8min")
    assert done.returncode == 2
    assert done.stderr.strip() == "GPU_CHECK_BUDGET=8min: expected seconds, e.g. 420"

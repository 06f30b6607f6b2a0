"""``multigpu verify`` end to end: real ``multigpu run`` children at world sizes 1 and 2.

Each run is a torchrun agent plus gloo workers (5-9 s on 2 cores); a FAIL costs a third run
(the reference world size again, to rule out nondeterminism). ``--cpu`` keeps the results
the same on a machine with GPUs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MLP = Path(__file__).resolve().parent / "scripts" / "mlp.py"


def verify(argv: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)
    return subprocess.run(
        [sys.executable, "-m", "multigpu", "verify", "--cpu", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_builtin_job_passes_sharded_with_fsdp_at_world_sizes_1_and_2(tmp_path: Path) -> None:
    done = verify(["--strategy", "fsdp", "--nproc", "1,2", "--steps", "20", "--json"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["verdict"] == "PASS", result
    assert result["device"] == "cpu" and result["world_sizes"] == [1, 2]
    assert result["rtol"] == 1e-4 and result["l2_rtol"] == 1e-2  # float32, Adam: L2
    (c,) = result["comparisons"]
    assert c["ok"] and c["steps"] == c["reference_steps"] == 20
    # Measured on 2 cores (DDP and FSDP alike): 2.8e-5 max (one Adam-amplified weight of fc1),
    # 3.4e-7 in L2, every loss within 2e-7.
    assert 0 < c["max_rel_diff"] <= 1e-3  # not bitwise (other reduction order): compared
    assert c["l2_rel_diff"] <= 1e-5
    assert c["losses"]["compared"] == 20 and c["losses"]["max_rel_diff"] <= 1e-6
    assert {t["name"] for t in c["tensors"]} >= {"conv1.weight", "fc2.bias"}
    assert [r["command"][4:6] for r in result["runs"]] == [["--cpu", "1"], ["--cpu", "2"]]
    assert result["reasons"] == []
    (note,) = result["notes"]
    assert note.startswith("Adam amplifies float rounding") and "L2 difference" in note


def test_readme_minimal_example_passes_and_keep_keeps_the_runs(tmp_path: Path) -> None:
    keep = tmp_path / "runs"
    done = verify(
        [str(ROOT / "examples" / "minimal.py"), "--steps", "20", "--keep", str(keep)], tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.rstrip().splitlines()
    assert lines[-1] == "PASS"
    assert "on CPU processes (gloo)" in lines[0]
    assert any(line.startswith("world size 2 vs 1: optimizer steps 20 vs 20") for line in lines)
    assert sorted(p.name for p in (keep / "ws2").iterdir()) == [
        "params.pt",
        "rank0.json",
        "rank1.json",
    ]
    assert not (tmp_path / "model.pt").exists()  # stopped after 20 steps, before its save


def test_dropout_fails_and_is_named(tmp_path: Path) -> None:
    done = verify([str(MLP), "--dropout", "0.5", "--steps", "20", "--json"], tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["verdict"] == "FAIL"
    (c,) = result["comparisons"]
    assert c["max_rel_diff"] > 1e-3 and c["losses"]["first_differing_step"] == 1
    assert len(result["reasons"]) == 1, result["reasons"]  # seeded: it repeats itself at ws 1
    assert result["reasons"][0].startswith("Dropout modules present ('2')")


def test_a_per_rank_batch_fails_naming_the_batch_size(tmp_path: Path) -> None:
    done = verify([str(MLP), "--per-rank-batch", "16", "--steps", "20"], tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.rstrip().splitlines()
    assert lines[-1] == "FAIL"
    assert "first differs at step 1" in done.stdout
    reasons = [line for line in lines if line.startswith("reason: ")]
    assert reasons == [
        "reason: the loaders' global batch size differs between runs (16 at world size 1, 32 at "
        "world size 2): a per-rank batch size? pass the GLOBAL batch to ctx.loader(batch_size="
        "...), never scaled by ctx.world_size"
    ]


@pytest.mark.parametrize(
    "argv",
    [["--nproc", "1"], ["no_such_script.py"]],  # the rest: test_options_and_report.py
)
def test_bad_input_exits_2_with_one_line(tmp_path: Path, argv: list[str]) -> None:
    done = verify(argv, tmp_path, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("multigpu: error: ")


def test_synchronized_batchnorm_is_not_blamed_the_cause_is_unknown(tmp_path: Path) -> None:
    # sync_batchnorm=True and a tolerance below float rounding: a FAIL that BatchNorm does not
    # explain (it was named from its running_mean alone); the records rule it out instead.
    script = Path(__file__).resolve().parent / "scripts" / "batchnorm_mlp.py"
    done = verify([str(script), "--steps", "10", "--rtol", "1e-12", "--json"], tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["verdict"] == "FAIL"
    (reason,) = result["reasons"]
    assert "not synchronized" not in reason and "sync_batchnorm=True" not in reason, reason
    assert reason.startswith("cause unknown: the records rule out Dropout"), reason
    assert "BatchNorm (synchronized: '1')" in reason and "float rounding" in reason

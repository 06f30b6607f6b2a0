"""``multigpu run`` end to end: real torchrun agents and gloo workers (a few seconds each)."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

from tests.launch._util import SCRIPTS, run_multigpu


def test_plain_torchrun_script_runs_unchanged_on_cpu_processes(tmp_path: Path) -> None:
    done = run_multigpu(
        ["run", "--cpu", "2", str(SCRIPTS / "allreduce.py"), str(tmp_path), "--lr", "1"], tmp_path
    )
    assert done.returncode == 0, done.stderr
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, result in enumerate(results):
        assert (result["rank"], result["local_rank"], result["world_size"]) == (rank, rank, 2)
        assert result["sum"] == 3.0  # 1 + 2: a real all-reduce across both workers
        assert result["args"] == ["--lr", "1"]
        assert result["env"]["MULTIGPU_DEVICE"] == "cpu"
        assert result["env"]["CUDA_VISIBLE_DEVICES"] == ""
        assert result["env"]["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] is None  # no restarts
        assert int(result["env"]["OMP_NUM_THREADS"]) >= 1


def test_a_failing_worker_exits_1_with_one_line_naming_it(tmp_path: Path) -> None:
    done = run_multigpu(["run", "--cpu", "2", str(SCRIPTS / "fail.py")], tmp_path)
    assert done.returncode == 1, done.stderr
    said, last = done.stderr.splitlines()  # torch's 20-line report and its E/W lines are gone
    assert said == "rank 1 fails on purpose"
    # Rank 0 exits at once; on a loaded machine the agent may stop it first (SIGTERM): then
    # the line also counts it, as a consequence.
    assert re.fullmatch(
        f"multigpu: error: rank 1 on {re.escape(socket.gethostname())} exited with code 1"
        r"( \(1 other rank stopped too\))?; its output is above",
        last,
    ), last


def test_workers_refusing_their_input_give_exit_2_without_a_crash_report(tmp_path: Path) -> None:
    done = run_multigpu(["run", "--cpu", "2", str(SCRIPTS / "bad_batch.py")], tmp_path)
    assert done.returncode == 2, done.stderr
    assert "batch_size=3 is not divisible by world_size=2" in done.stdout + done.stderr
    assert "Root Cause" not in done.stderr
    assert done.stderr.rstrip().splitlines()[-1].startswith("multigpu: error: rank ")
    assert "(a usage error)" in done.stderr


def test_a_usage_error_is_not_restarted_whatever_max_restarts_allows(tmp_path: Path) -> None:
    """A restart meets the same refusal: the agent ends the run at the first one."""
    starts = tmp_path / "starts"
    script = str(SCRIPTS / "usage_error_counted.py")
    done = run_multigpu(["run", "--cpu", "2", "--max-restarts", "3", script, str(starts)], tmp_path)
    assert done.returncode == 2, done.stderr
    assert sorted(starts.read_text().split()) == ["0", "1"]  # one start of each rank
    assert "restarting the workers" not in done.stderr
    assert [line for line in done.stderr.splitlines() if "not divisible" in line] == [
        done.stderr.rstrip().splitlines()[-1]
    ]


def test_a_usage_error_escaping_a_launched_script_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = run_multigpu(["run", "--cpu", "2", str(SCRIPTS / "fsdp_no_params.py")], tmp_path)
    assert done.returncode == 2, done.stderr
    refusals = [
        line for line in done.stderr.splitlines() if "got a model with no parameters" in line
    ]
    assert refusals == [
        f"multigpu: error: rank 0 on {socket.gethostname()}: UsageError: strategy='fsdp' got a "
        "model with no parameters (ReLU); FSDP shards parameters: give the model that holds "
        "them, or use strategy='ddp' (1 other rank stopped too)"
    ]
    assert "Traceback" not in done.stderr and "Root Cause" not in done.stderr


def test_a_checkpoint_of_another_shape_ends_the_run_with_one_line_and_exit_2(
    tmp_path: Path,
) -> None:
    script = str(SCRIPTS / "load_other_shape.py")
    done = run_multigpu(["run", "--cpu", "1", script, str(tmp_path)], tmp_path)
    assert done.returncode == 2, done.stderr
    said = [line for line in done.stderr.splitlines() if "does not fit this model" in line]
    assert len(said) == 1 and said[0].startswith("multigpu: error: rank 0 on "), done.stderr
    assert "CheckpointMismatchError: checkpoint " in said[0]
    assert "model.weight (3, 4) in the checkpoint vs (3, 5) here" in said[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small"]  # nothing else written

"""Pipeline plans without processes: split points, stage counts, schedules, launcher checks."""

from __future__ import annotations

import subprocess
import sys

import pytest

from multigpu.errors import UsageError
from multigpu.launch.train import check_pipeline_options
from multigpu.strategies.pipeline.plan import (
    check_microbatches,
    check_schedule,
    default_split_points,
    schedule_bubble,
    stages_per_process,
)
from tests.strategies.pipeline_workers import Net


def test_default_split_points_cut_the_longest_block_list_evenly() -> None:
    assert default_split_points(Net(), 2) == ["blocks.2"]
    assert default_split_points(Net(), 4) == ["blocks.1", "blocks.2", "blocks.3"]
    with pytest.raises(UsageError, match="blocks has 4 blocks"):
        default_split_points(Net(), 5)


def test_stage_counts_schedules_and_microbatches_are_checked() -> None:
    assert stages_per_process(4, 2, "interleaved-1f1b") == 2
    with pytest.raises(UsageError, match="3 pipeline stages on 2 processes"):
        stages_per_process(3, 2, "1f1b")
    with pytest.raises(UsageError, match="need schedule='interleaved-1f1b'"):
        stages_per_process(4, 2, "gpipe")
    with pytest.raises(UsageError, match="schedule='zb' is not known"):
        check_schedule("zb")
    with pytest.raises(UsageError, match="microbatches=0"):
        check_microbatches(0)
    assert schedule_bubble("gpipe", 4, 1, 12) == pytest.approx(3 / 15)


@pytest.mark.parametrize(
    ("args", "processes", "said"),
    [
        (["--batch-size", "30"], 2, "--batch-size 30 does not split into --microbatches 4"),
        (["--n-layer", "1"], 2, "more stages than blocks"),
        ([], 1, "needs at least 2 processes"),
    ],
)
def test_launcher_refuses_a_pipeline_the_lm_cannot_build(
    args: list[str], processes: int, said: str
) -> None:
    with pytest.raises(UsageError, match=said):
        check_pipeline_options(["--strategy", "pipeline", *args], processes, "lm")


def test_train_refuses_a_batch_the_microbatches_do_not_divide_before_any_worker(
    tmp_path: object,
) -> None:
    out = f"{tmp_path}/run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "multigpu",
            "train",
            "--model",
            "lm",
            "--strategy",
            "pipeline",
            "--cpu",
            "2",
            "--steps",
            "5",
            "--batch-size",
            "30",
            "--out",
            out,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not split into --microbatches 4" in lines[0]
    assert not __import__("os").path.exists(out)

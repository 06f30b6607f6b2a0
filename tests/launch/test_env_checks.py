"""A bad ``MULTIGPU_*`` value: refused by the launcher before any worker starts when it can see
it, and by the worker's ``multigpu.init`` (one line, exit 2, no traceback) when only the worker
can (a script that sets it itself)."""

from __future__ import annotations

from pathlib import Path

import pytest

from multigpu.errors import UsageError
from multigpu.launch.env_checks import check_worker_environment
from multigpu.launch.options import LaunchOptions
from multigpu.launch.plan import LaunchPlan, build_plan, request_devices
from tests.launch._util import run_multigpu


def _cpu_plan() -> LaunchPlan:
    options = LaunchOptions(script="train.py", cpu=2)
    return build_plan(options, request_devices(options, gpu_count=0, cores=2), environ={}, cores=2)


def test_the_users_values_are_checked_even_where_the_plan_sets_the_variable():
    plan = _cpu_plan()
    assert plan.env["MULTIGPU_DEVICE"] == "cpu"
    check_worker_environment(plan, {"MULTIGPU_DEVICE": "cpu", "MULTIGPU_STRATEGY": "ddp"})
    with pytest.raises(UsageError, match="MULTIGPU_DEVICE='tpu'"):
        check_worker_environment(plan, {"MULTIGPU_DEVICE": "tpu"})


def test_nccl_from_the_environment_for_cpu_processes_is_refused():
    with pytest.raises(UsageError, match="MULTIGPU_BACKEND=nccl .* workers are CPU processes"):
        check_worker_environment(_cpu_plan(), {"MULTIGPU_BACKEND": "nccl"})


SCRIPT = """
import os
os.environ["MULTIGPU_STRATEGY"] = "bogus"  # set by the script: the launcher cannot see it
import multigpu
with multigpu.init() as ctx:
    open(f"trained-{ctx.rank}", "w").close()
"""


def test_a_bad_variable_only_the_worker_sees_ends_in_one_line_and_exit_2(tmp_path: Path):
    # Before: the UsageError left init() unrecorded: a traceback per rank and exit code 1.
    (tmp_path / "s.py").write_text(SCRIPT)
    done = run_multigpu(["run", "--cpu", "2", "s.py"], tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("multigpu: error: rank 0 on "), lines
    assert "UsageError: MULTIGPU_STRATEGY='bogus' (from the environment)" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.py"]

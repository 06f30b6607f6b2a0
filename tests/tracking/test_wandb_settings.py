"""W&B's own variables decide the run (``WANDB_RUN_ID``, ``WANDB_NAME``, ``WANDB_PROJECT``,
``WANDB_ENTITY``, ``WANDB_DIR``, ``WANDB_MODE``): multigpu passes ``wandb.init`` only what they
leave unset, and a resumed job continues that run. Offline here (no W&B server to reach); the
run file is read back with wandb's own record type."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.launch._util import child_env
from tests.tracking.wandb_records import history, records

pytestmark = pytest.mark.requires("module:wandb")


def test_wandb_variables_win_and_a_resume_continues_their_run(tmp_path: Path) -> None:
    script = Path(__file__).with_name("two_jobs.py")
    wandb_dir = tmp_path / "team-wandb"
    wandb_dir.mkdir()
    env = child_env(
        {
            "WANDB_MODE": "offline",
            "WANDB_SILENT": "true",
            "WANDB_RUN_ID": "mgteam01",
            "WANDB_NAME": "team-name",
            "WANDB_PROJECT": "team-project",
            "WANDB_ENTITY": "team",
            "WANDB_DIR": str(wandb_dir),
            "MULTIGPU_DEVICE": "cpu",
        }
    )
    log_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, str(script), "wandb", str(log_dir)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    opened = [ln for ln in done.stdout.splitlines() if ln.startswith("tracking:")]
    assert len(opened) == 2 and all("wandb: run mgteam01 offline in " in ln for ln in opened)
    assert not (log_dir / "wandb").exists()  # WANDB_DIR, not the log directory
    # offline-run-TIME-ID, and -ID-1 for a second job starting within the same second
    files = sorted(wandb_dir.glob("wandb/offline-run-*-mgteam01*/run-mgteam01.wandb"))
    assert len(files) == 2  # one run, two jobs
    runs = [r.run for f in files for r in records(f) if r.WhichOneof("record_type") == "run"]
    assert {(r.run_id, r.display_name, r.project, r.entity) for r in runs} == {
        ("mgteam01", "team-name", "team-project", "team")
    }
    rows = [(s, values) for f in files for s, values in history(f)]
    assert [s for s, values in rows if "loss" in values] == list(range(1, 10))

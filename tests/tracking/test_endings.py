"""How runs with trackers and profiles end (issue 37): each ending at most 2 lines, cause first.

Every case is ``multigpu run --cpu 2`` of a script in ``scripts/`` as a new user would run it:
Ctrl-C is SIGINT to the launcher's process group (as a terminal sends it, once or twice), a
full disk is a 2 MiB tmpfs that the script fills (mounting needs root). Measured before the
changes: Ctrl-C with W&B 59-140 lines ending in ``worker_exit._on_sigint``; a double Ctrl-C 1 line
(the one naming the last checkpoint lost); a full disk at a flush 56-72 lines (336 with MLflow);
a bad ``ctx.log`` value 2 lines ("a collective failed" first); an unwritable ``profile_dir`` 35
lines and exit 1 at the profiled step.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from multigpu.checkpoint.native.layout import COMMIT_FILE
from tests.launch._util import child_env, run_multigpu

SCRIPTS = Path(__file__).resolve().parent / "scripts"
STRATEGY_NOTE = "multigpu: strategy auto chose"  # auto's one line at the start, not an ending
STOPPED = "multigpu: stopped by Ctrl-C (SIGINT): the 2 workers on this node were stopped"


def _ending(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if not line.startswith(STRATEGY_NOTE)]


@pytest.mark.requires("root")
@pytest.mark.parametrize(
    ("names", "when"),
    [("tensorboard,csv", "flush"), ("csv", "end"),
     pytest.param("mlflow", "flush", marks=pytest.mark.requires("module:mlflow"))],
)  # fmt: skip
def test_a_full_disk_while_the_trackers_write_ends_in_one_line(
    small_disk: Path, names: str, when: str
) -> None:
    pytest.importorskip("tensorboard") if "tensorboard" in names else None
    logs = small_disk / "logs"
    done = run_multigpu(
        ["run", "--cpu", "2", str(SCRIPTS / "full_disk.py"), names, str(logs), when],
        small_disk.parent, timeout=180,
    )  # fmt: skip
    lines = [line for line in _ending(done.stderr) if "INFO mlflow" not in line]  # its start
    assert done.returncode == 1, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("multigpu: error: rank 0 on "), done.stderr
    assert (
        "TrackingError: " in lines[0]
        and f" in {logs} failed: No space left on device (" in (lines[0])
    )
    assert "Traceback" not in done.stderr + done.stdout
    assert ("trained 10 steps" in done.stdout) == (when == "end")


def test_a_value_no_tracker_takes_is_one_line_exit_2(tmp_path: Path) -> None:
    done = run_multigpu(
        ["run", "--cpu", "2", str(SCRIPTS / "bad_value.py"), "csv", str(tmp_path / "logs")],
        tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert _ending(done.stderr) == [
        f"multigpu: error: rank 0 on {os.uname().nodename}: UsageError: ctx.log: loss='high': "
        "expected a number or a one-element tensor (1 other rank stopped too)"
    ], done.stderr


def test_a_profile_dir_that_cannot_be_written_is_refused_at_init(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    done = run_multigpu(
        ["run", "--cpu", "2", str(SCRIPTS / "slow_tracked.py"), str(tmp_path / "ck"), "",
         str(blocker), "3:4"],
        tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = _ending(done.stderr)
    assert len(lines) == 1, done.stderr
    assert (
        f"UsageError: profile directory {blocker}/profile: cannot write there (Not a " in (lines[0])
    )
    assert not (tmp_path / "ck").exists()  # refused before the loop


def _interrupt(tmp_path: Path, names: str, *, twice: bool, profile: str = "") -> dict[str, Any]:
    """Run ``slow_tracked.py`` until its third checkpoint, then Ctrl-C (twice: 0.3 s apart)."""
    directory, log = tmp_path / "ck", tmp_path / "out.txt"
    window = [profile] if profile else []
    with log.open("w") as fh:
        held = subprocess.Popen(
            [sys.executable, "-m", "multigpu", "run", "--cpu", "2",
             str(SCRIPTS / "slow_tracked.py"), str(directory), names, str(tmp_path / "logs"),
             *window],
            cwd=tmp_path, env=child_env({"WANDB_MODE": "offline"}), stdout=fh,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        third = directory / "step-00000003" / COMMIT_FILE  # complete (the marker is last)
        while not third.exists() and time.monotonic() < deadline:
            assert held.poll() is None, log.read_text()
            time.sleep(0.1)
        before = len(log.read_text().splitlines())
        started = time.monotonic()
        os.killpg(held.pid, signal.SIGINT)  # the whole foreground group, as a terminal does
        if twice:
            time.sleep(0.3)
            os.killpg(held.pid, signal.SIGINT)
        code = held.wait(timeout=60)
        seconds = time.monotonic() - started
    finally:
        if held.poll() is None:
            os.killpg(held.pid, signal.SIGKILL)
            held.wait()
    output = log.read_text()
    return {"code": code, "lines": output.splitlines()[before:], "output": output,
            "seconds": seconds, "directory": directory}  # fmt: skip


def _named_checkpoint(line: str, directory: Path) -> None:
    assert line.startswith("multigpu: rank 0 stopped by Ctrl-C (SIGINT); last checkpoint: ")
    step = int(line.rsplit("(step ", 1)[1].rstrip(")"))
    assert step >= 3 and f"{directory}/step-{step:08d} " in line


@pytest.mark.requires("module:wandb")
def test_ctrl_c_with_wandb_ends_in_two_lines(tmp_path: Path) -> None:
    ended = _interrupt(tmp_path, "wandb", twice=False)
    lines, output = ended["lines"], ended["output"]
    assert ended["code"] == 130, output
    assert len(lines) == 2, output
    assert "Traceback" not in output and "_on_sigint" not in output, output
    _named_checkpoint(lines[0], ended["directory"])
    assert lines[1] == STOPPED


def test_a_double_ctrl_c_keeps_the_line_naming_the_last_checkpoint(tmp_path: Path) -> None:
    ended = _interrupt(tmp_path, "csv", twice=True)
    lines, output = ended["lines"], ended["output"]
    assert ended["code"] == 130, output
    assert len(lines) == 2 and "Traceback" not in output, output
    _named_checkpoint(lines[0], ended["directory"])
    assert lines[1] == STOPPED


@pytest.mark.requires("module:tensorboard")
def test_ctrl_c_inside_a_profile_window_with_tensorboard_and_csv_ends_in_two_lines(
    tmp_path: Path,
) -> None:
    # The README's `--log-to tensorboard,csv --profile 3:5`: the profile's own line ("the run
    # ended before step N") came between the two; 15.9 s to exit was reported (2.8 s without
    # trackers): the agent's shutdown timeout (15 s), after which it kills a worker that
    # did not end.
    ended = _interrupt(tmp_path, "tensorboard,csv", twice=False, profile="2:100000")
    lines, output = ended["lines"], ended["output"]
    assert ended["code"] == 130, output
    assert len(lines) == 2 and "Traceback" not in output, output
    _named_checkpoint(lines[0], ended["directory"])
    assert lines[1] == STOPPED
    assert ended["seconds"] < 15, ended["seconds"]
    assert (tmp_path / "logs" / "profile" / "rank0.json").is_file()  # written, not said

"""kill -9 of a worker under ``multigpu train --max-restarts``: the run recovers by itself.

The built-in job checkpoints every few steps; a test kills one worker (SIGKILL, chosen at
random) as soon as a checkpoint of a randomly chosen step appears — so the kill lands anywhere
in the next steps, sometimes in the middle of a save. The elastic agent restarts both workers,
they resume from the newest complete checkpoint by themselves, and the finished run's
parameters are bitwise those of an uninterrupted run (``param_sha256`` in metrics.json).
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.launch._util import child_env

EPOCHS = 3
EVERY = 4  # 1437 training samples / 64 = 22 steps per epoch: checkpoints at 4, 8, ..., 64
JOB = "multigpu.examples.digits"
TRIALS = int(os.environ.get("MULTIGPU_KILL_TRIALS", "1"))  # more: MULTIGPU_KILL_TRIALS=20


def _train_argv(out: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "multigpu", "train", "--cpu", "2", "--epochs", str(EPOCHS),
        "--progress", "lines", "--out", str(out), "--checkpoint-every", str(EVERY), *extra,
    ]  # fmt: skip


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as fh:  # a file, not a pipe: nobody reads while we poll
        return subprocess.Popen(
            argv, cwd=log.parent, env=child_env(), stdout=fh, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


def _workers(agent_pid: int) -> list[int]:
    """Pids of the job's worker processes among the children of the launcher (the agent)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == agent_pid and JOB in cmdline:
            pids.append(int(entry.name))
    return sorted(pids)


def _complete_steps(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return sorted(
        int(p.name.split("-")[1]) for p in directory.glob("step-*") if (p / "COMMITTED").exists()
    )


def _wait(proc: subprocess.Popen[bytes], log: Path, timeout: float = 240) -> str:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired as e:
        os.killpg(proc.pid, signal.SIGKILL)  # the group we started (start_new_session)
        proc.wait()
        raise AssertionError(f"the run did not finish in {timeout} s:\n{log.read_text()}") from e
    return log.read_text()


def _uninterrupted(out: Path, *extra: str) -> dict[str, object]:
    """A run that is never killed and saves no checkpoint: the reference. A killed run (which
    checkpoints, is restarted and resumes) that ends bitwise equal to it shows both that the
    resume is exact and that checkpointing changes nothing."""
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.parent / "log.txt"
    argv = [a for a in _train_argv(out, *extra) if a not in ("--checkpoint-every", str(EVERY))]
    text = _wait(_start(argv, log), log)
    metrics: dict[str, object] = json.loads((out / "metrics.json").read_text())
    assert metrics["restarts"] == 0 and metrics["resumed_from_step"] is None, text
    assert not (out / "checkpoints").exists()  # --out without --checkpoint-every: none
    return metrics


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    return _uninterrupted(tmp_path_factory.mktemp("uninterrupted") / "run")


@pytest.mark.parametrize("seed", range(TRIALS))
def test_a_killed_worker_is_restarted_and_the_run_ends_bitwise_equal(
    tmp_path: Path, uninterrupted: dict, seed: int
) -> None:
    _kill_and_compare(tmp_path, uninterrupted, seed)


def test_a_killed_fsdp_worker_resumes_its_shards_and_ends_bitwise_equal(
    tmp_path: Path,
) -> None:
    fsdp = ("--strategy", "fsdp")
    reference = _uninterrupted(tmp_path / "reference" / "run", *fsdp)
    _kill_and_compare(tmp_path / "killed", reference, 7, *fsdp)


def _kill_and_compare(tmp_path: Path, uninterrupted: dict, seed: int, *extra: str) -> None:
    rng = random.Random(seed)
    target = rng.choice(range(EVERY, 60, EVERY))  # a checkpoint before the last one
    victim = rng.randrange(2)  # local rank
    out = tmp_path / "run"
    log = tmp_path / "log.txt"
    tmp_path.mkdir(parents=True, exist_ok=True)
    proc = _start(_train_argv(out, "--max-restarts", "3", *extra), log)
    killed = None
    deadline = time.monotonic() + 180
    while killed is None and proc.poll() is None and time.monotonic() < deadline:
        if (
            _complete_steps(out / "checkpoints")
            and max(_complete_steps(out / "checkpoints")) >= target
        ):
            workers = _workers(proc.pid)
            if len(workers) == 2:
                os.kill(workers[victim], signal.SIGKILL)
                killed = workers[victim]
        time.sleep(0.002)
    text = _wait(proc, log)
    assert killed is not None, f"no worker was killed (target step {target}):\n{text}"
    assert proc.returncode == 0, text
    # the launcher says what happened as it happens (it printed nothing for ~20 s before)
    said = [line for line in text.splitlines() if "restarting the workers (restart 1 of 3)" in line]
    assert len(said) == 1, text
    assert said[0].startswith(f"multigpu: rank {victim} on {socket.gethostname()} was killed by "
                              "SIGKILL"), text  # fmt: skip
    assert "rendezvous round 2: 1 node(s), world size 2;" in text, text
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["restarts"] >= 1, text
    assert metrics["resumed_from_step"] is not None and metrics["resumed_from_step"] >= target
    assert len(metrics["history"]) == EPOCHS
    assert metrics["param_sha256"] == uninterrupted["param_sha256"], text
    assert _complete_steps(out / "checkpoints")[-3:] == [56, 60, 64]  # keep=3: the newest
    assert [r["loss"] for r in metrics["history"]] == [
        r["loss"]
        for r in uninterrupted["history"]  # type: ignore[attr-defined]
    ]

"""The loops people write, under `multigpu run --replicas 2 --cpu 1`, one worker killed by kill -9.

README's `for epoch in range(E)` with a StepLR stepped per epoch (its counter restarts at 0 in the
restarted group), and a Checkpointer-bounded `while ckpt.steps < N` with a StepLR stepped when
`ctx.step` returns True (its count and the scheduler heal), and a `while loader.epoch < E` loop
under `precision="16-mixed"` with a clip, and a Checkpointer loop over a stream (an
IterableDataset through the loader's shuffle buffer): both groups end with the parameters
of the uninterrupted run, exactly one process writes the user's `ctx.is_main` output, and torch
says nothing of an overridden `optimizer.step()`. The survivor waits at step 40 until the killed
group's next life has started, and goes on slowly until that life stepped (`JOB_WAIT_*`,
`JOB_SLOW_UNTIL` of scripts/loops.py), so the heal lands mid-run on a machine of any speed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.launch._util import popen_multigpu
from tests.replicas.chaos import LOOPS, TOLERANCE, _position, uninterrupted

pytest.importorskip("torchft", reason="torchft (pip install multigpu[ft]) is not installed")

KILL_AT = 15


def _kill_group_1_and_wait_for_its_next_step(proc: subprocess.Popen[str], out: Path) -> None:
    """kill -9 group 1's worker once it passed step ``KILL_AT``; return once its next life
    healed and stepped."""
    deadline = time.monotonic() + 240
    while _position(out / "steps-1-0") < KILL_AT:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "group 1 did not reach its step"
        time.sleep(0.02)
    os.kill(int((out / "pid-1-0-0").read_text()), signal.SIGKILL)
    first_life = len((out / "steps-1-0").read_text().splitlines())
    while len((out / "steps-1-0").read_text().splitlines()) <= first_life:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline + 180, "group 1 did not come back in time"
        time.sleep(0.05)


def _difference(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    return max(
        ((got[k] - r).abs().max() / r.abs().max().clamp_min(1e-12)).item() for k, r in ref.items()
    )


@pytest.mark.parametrize(
    ("shape", "lr", "job_env"),
    [
        ("readme", "epoch", {}),
        ("ckpt", "step", {}),
        # float16 with a clip: a survivor's shares each unscaled, the groups' infs agreed
        ("while", "step", {"JOB_PRECISION": "16-mixed", "JOB_CLIP": "0.5"}),
        # a stream (an IterableDataset through the shuffle buffer), read whole by each group
        ("ckpt", "epoch", {"JOB_DATA": "stream"}),
    ],
    ids=[
        "readme-steplr-per-epoch",
        "checkpointer-steplr-per-step",
        "while-16-mixed-clip",
        "checkpointer-stream",
    ],
)
def test_a_killed_worker_leaves_both_groups_with_the_uninterrupted_result_and_one_writer(
    shape: str, lr: str, job_env: dict[str, str], tmp_path: Path
) -> None:
    reference = uninterrupted(shape, lr, "ddp", tmp_path / "reference", **job_env)
    assert (tmp_path / "reference" / "writers").read_text().split() == ["0"]
    out = tmp_path / "killed"
    out.mkdir()
    proc = popen_multigpu(
        ["run", "--replicas", "2", "--cpu", "1", str(LOOPS), str(out), shape, lr], out,
        JOB_SLEEP="0.02", JOB_WAIT_AT="40", JOB_WAIT_FOR=str(out / "pid-1-0-1"),
        JOB_SLOW_UNTIL=str(out / "rejoined"), **job_env,
    )  # fmt: skip
    try:
        _kill_group_1_and_wait_for_its_next_step(proc, out)
        (out / "rejoined").touch()  # the survivor goes on at full speed
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, err
    assert "replica group 1: healed from replica group 0 at step" in err, err
    assert "overridden" not in err  # no torch warning about a wrapper the user did not write
    for group in (0, 1):
        got = torch.load(out / f"params-{group}-0.pt")
        assert _difference(got, reference) <= TOLERANCE, (group, err)
    assert (out / "writers").read_text().split() == ["0"]  # one ctx.is_main in the whole job


def test_every_group_restarted_mid_job_ends_in_one_line_before_the_end_is_passed(
    tmp_path: Path,
) -> None:
    """Group 1 killed, healed from group 0 (its loop counter behind the job's); then group 0
    killed, healed from group 1: no group left knows where README's `for epoch in range(E)`
    ends, so the run ends in one line, with exit code 1 and no output written as if done."""
    out = tmp_path / "killed"
    out.mkdir()
    proc = popen_multigpu(
        ["run", "--replicas", "2", "--cpu", "1", str(LOOPS), str(out), "readme", "epoch"], out,
        JOB_SLEEP="0.02", JOB_WAIT_AT="40", JOB_WAIT_FOR=str(out / "pid-1-0-1"),
        JOB_SLOW_UNTIL=str(out / "never"),
    )  # fmt: skip
    try:
        _kill_group_1_and_wait_for_its_next_step(proc, out)
        os.kill(int((out / "pid-0-0-0").read_text()), signal.SIGKILL)  # group 0, aligned
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("multigpu: error: rank 0 on "), last
    assert "restarted after the job's start and healed into it" in last, last
    assert "restarting the workers (restart 2" not in err  # no restart of a final error
    assert not (out / "writers").exists()

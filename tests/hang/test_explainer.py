"""The hang explainer end to end: real 2-process runs that hang or abort, and what is printed.

Each script runs under ``multigpu run --cpu 2`` with a 10 s collective timeout, so the
watchdog reports after 5 s and the job ends at about 10 s instead of hanging.
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import IO

from tests.launch._util import popen_multigpu, run_multigpu

SCRIPTS = Path(__file__).parent / "scripts"


def _run(script: str, tmp_path: Path) -> tuple[str, float]:
    """The run's output, and its seconds from the first hang line (the watchdog's, 5 s into the
    hang; inf without one) to its end: the launch before (two workers importing torch: 19 s at
    load 10) is bounded by nothing but the machine."""
    proc = popen_multigpu(["run", "--cpu", "2", str(SCRIPTS / script)], tmp_path,
                          MULTIGPU_TIMEOUT="10")  # fmt: skip
    lines: list[tuple[float, str]] = []

    def read(pipe: IO[str]) -> None:
        for line in pipe:
            lines.append((time.monotonic(), line))

    readers = [threading.Thread(target=read, args=(pipe,)) for pipe in (proc.stdout, proc.stderr)]
    for reader in readers:
        reader.start()
    try:
        proc.wait(timeout=240)  # a hang of the product; its timeout ends the job long before
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for reader in readers:
            reader.join()
    ended = time.monotonic()
    out = "".join(line for _, line in sorted(lines, key=lambda entry: entry[0]))
    assert proc.returncode == 1, out
    hang = min((at for at, line in lines if "multigpu: hang" in line), default=ended)
    return out, ended - hang if hang < ended else math.inf


def test_a_skipped_all_reduce_is_named_with_its_line_and_counts(tmp_path: Path) -> None:
    out, seconds = _run("skip_allreduce.py", tmp_path)
    assert "multigpu: hang: no collective has finished for 5 s" in out
    assert "rank 0 (" in out and "waits in all_reduce #8 float32[3] at skip_allreduce.py:10" in out
    assert "waits in barrier #8 at skip_allreduce.py:11" in out
    assert "the ranks wait in different collectives" in out
    assert "ran 8 times on rank 0, 7 times on rank 1: rank 1 skipped it" in out
    assert "[rank 1] multigpu: hang report: at skip_allreduce.py:11" in out  # every rank's stack
    assert seconds < 45  # the timeout (10 s) ended the job, 5 s after the hang line; not gloo's


def test_a_rank_busy_outside_collectives_is_found_where_it_is(tmp_path: Path) -> None:
    out, seconds = _run("busy_rank.py", tmp_path)
    assert "waits in all_reduce #2 float32[2] at busy_rank.py:20 in <module>()" in out
    assert "rank 1 (" in out and "is in no collective: at busy_rank.py:13 in evaluate()" in out
    assert "rank 1 is in no collective while rank 0 waits" in out
    # Rank 1 would have been busy 55 s more: the timeout (10 s, 5 s after the hang line) ended it.
    assert seconds < 45


def test_a_collective_run_by_rank_0_alone_is_named_after_gloo_aborts(tmp_path: Path) -> None:
    out, _ = _run("eval_on_rank0.py", tmp_path)
    assert "multigpu: each rank's last collective:" in out
    assert (
        "rank 0: all_reduce #6 float32[] at eval_on_rank0.py:11 in evaluate() (NOT finished" in out
    )
    assert (
        "the ranks first disagree at collective #6 (rank 0: all_reduce at eval_on_rank0.py:11"
        in out
    )
    assert "rank 1: backward (DDP gradient all-reduce) at eval_on_rank0.py:18" in out


def test_a_slow_rank_is_named_at_the_end_of_the_run(tmp_path: Path) -> None:
    done = run_multigpu(["run", "--cpu", "2", str(SCRIPTS / "straggler.py")], tmp_path, timeout=90)
    assert done.returncode == 0, done.stderr
    assert (
        "rank 1: " in done.stderr and "x the median" in done.stderr and "a straggler" in done.stderr
    )
    assert "rank 0: " not in done.stderr.split("per rank:", 1)[1]

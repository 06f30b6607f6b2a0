"""A failed run ends with one line naming the first failing rank, its host, the error's type and
message, and where the rest is; exit 2 when the failing workers refused their input."""

from __future__ import annotations

import json
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from multigpu.common import worker_error
from multigpu.errors import UsageError
from multigpu.launch.failure_summary import exit_code, failures_of, summary_line
from tests.launch._util import SCRIPTS, run_multigpu

HOST = socket.gethostname()


def test_the_cause_not_its_consequence_is_named_in_the_last_line(tmp_path: Path) -> None:
    done = run_multigpu(["run", "--cpu", "2", str(SCRIPTS / "raise_in_rank1.py")], tmp_path)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.rstrip().splitlines()
    assert lines[-1] == (
        f"multigpu: error: rank 1 on {HOST} failed: ValueError: rank one is unhappy with its "
        "input (1 other rank stopped too); its output is above"
    )
    assert "[rank1]: Traceback (most recent call last):" in lines  # the cause's traceback
    assert sum("Traceback" in line for line in lines) == 1  # rank 0's lost peer: not printed
    assert not any(line.startswith(("E1", "W1", "====")) for line in lines), done.stderr
    assert len(lines) <= 12, done.stderr


def _failure(
    tmp_path: Path, rank: int, exitcode: int, error: BaseException | None
) -> ProcessFailure:
    path = tmp_path / f"error-{rank}.json"
    if error is not None:
        assert worker_error.record(error, {"TORCHELASTIC_ERROR_FILE": str(path)})
        time.sleep(0.01)  # recorded one after the other
    return ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=exitcode, error_file=str(path))


def _summary(tmp_path: Path, *failures: tuple[int, int, BaseException | None]) -> tuple[str, int]:
    found = {r: _failure(tmp_path, r, code, e) for r, code, e in failures}
    ordered = failures_of(ChildFailedError("train.py", found))
    return summary_line(ordered), exit_code(ordered)


def test_a_killed_rank_is_the_cause_of_its_peers_lost_connection(tmp_path: Path) -> None:
    lost = RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:4242")
    line, code = _summary(tmp_path, (0, 1, lost), (1, -signal.SIGKILL, None))
    assert line.startswith(f"rank 1 on {HOST} was killed by SIGKILL (often the kernel's out-of")
    assert code == 1


def test_the_same_usage_error_on_every_rank_names_rank_0_and_exits_2(tmp_path: Path) -> None:
    line, code = _summary(
        tmp_path, (1, 2, UsageError("batch_size=3")), (0, 2, UsageError("batch_size=3"))
    )
    assert line == f"rank 0 on {HOST}: UsageError: batch_size=3 (1 other rank stopped too)"
    assert code == 2
    line, code = _summary(tmp_path, (0, 2, UsageError("x")), (1, -signal.SIGTERM, None))
    assert code == 2, "a rank the agent stopped after the refusal is no failure of its own"
    line, code = _summary(tmp_path, (0, 2, UsageError("x")), (1, 1, ValueError("y")))
    assert code == 1, "a crash beside a refusal is a crash"
    # Seen in CI: rank 1 waited in a broadcast from rank 0, which refused (a locked checkpoint
    # directory) and left; rank 1's lost peer is the refusal's consequence, not a crash.
    lost = RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:395")
    line, code = _summary(tmp_path, (0, 2, UsageError("in use")), (1, 1, lost))
    assert line.startswith(f"rank 0 on {HOST}: UsageError: in use") and code == 2
    line, code = _summary(tmp_path, (1, 1, lost))
    assert code == 1, "a lost peer alone: the cause is elsewhere, not a refusal here"


def test_only_a_lost_peer_on_this_node_says_the_cause_is_elsewhere(tmp_path: Path) -> None:
    lost = RuntimeError("Connection reset by peer")
    line, _ = _summary(tmp_path, (2, 1, lost))
    assert "it lost a peer: the rank that stopped first (on another node?) holds the cause" in line


def test_the_error_file_keeps_torchs_format(tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    try:
        raise KeyError("k")
    except KeyError as e:
        worker_error.record(e, {"TORCHELASTIC_ERROR_FILE": str(path)})
    data = json.loads(path.read_text())
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(path))
    assert failure.message["message"] == "KeyError: 'k'"  # what torch's own report reads
    assert "raise KeyError" in data["message"]["extraInfo"]["py_callstack"]
    assert not worker_error.record(SystemExit(1), {"TORCHELASTIC_ERROR_FILE": str(path)})


WRITE_FOREVER = """
import sys
from multigpu.common import worker_error
error = RuntimeError("x" * 2_000_000)  # big enough that a write takes several system calls
print("ready", flush=True)
while True:
    worker_error.record(error, {"TORCHELASTIC_ERROR_FILE": sys.argv[1]})
"""


def test_a_worker_killed_while_writing_its_error_file_leaves_it_whole_or_absent(
    tmp_path: Path,
) -> None:
    # CI saw torch's agent end a launch with "JSONDecodeError" instead of the failure: a rank
    # stopped while writing left its error file empty, and torch raises on a file it cannot
    # parse. Seeded kill times over a writer that rewrites the file without pause.
    rng = random.Random(38)
    for attempt in range(12):
        path = tmp_path / f"error-{attempt}.json"
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITE_FOREVER, str(path)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert writer.stdout is not None and writer.stdout.readline() == "ready\n"
            time.sleep(rng.uniform(0.0, 0.3))
        finally:
            writer.kill()
            writer.wait(timeout=30)
        if path.exists():  # what torch's agent reads: it raises on a partial file
            failure = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(path))
            assert failure.message["message"].startswith("RuntimeError: xxx")


def test_the_same_error_names_rank_0_when_its_end_is_slower_than_the_others(
    tmp_path: Path,
) -> None:
    # CI named rank 1 for a damaged safetensors file every rank failed to read: rank 0 was still
    # tearing down when rank 1 had exited, the agent stopped it, and its error was not recorded.
    done = run_multigpu(["run", "--cpu", "2", str(SCRIPTS / "same_error_slow_end.py")], tmp_path)
    assert done.returncode == 1, done.stderr
    last = done.stderr.rstrip().splitlines()[-1]
    assert last.startswith(
        f"multigpu: error: rank 0 on {HOST} failed: ValueError: the same input is refused on "
        "every rank"
    ), done.stderr

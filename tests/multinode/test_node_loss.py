"""A node dies (every process of its host SIGKILLed) in an elastic job: what the others do.

With ``--nnodes 1:2 --max-restarts 1`` and checkpoints on a shared file system, the node that
hosts the rendezvous store restarts its workers, the rendezvous closes with the nodes that are
left (one), and the built-in job resumes from its last complete checkpoint at world size 1 and
finishes. When the dead node is the store's host instead, the survivor cannot go on (restarts
included) and says so in one line. Both behaviours are in docs/many-machines.md.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from multigpu.testing.hosts import Host
from tests.multinode._util import HUNG, c10d_args, start, wait_all

TIMEOUT = 15


def _train_argv(store: Host, out: Path) -> list[str]:
    return ["train", "--cpu", "1", *c10d_args(store, nnodes="1:2"), "--max-restarts", "1",
            "--timeout", str(TIMEOUT), "--epochs", "2", "--checkpoint-every", "4",
            "--out", str(out)]  # fmt: skip


def _wait_for_checkpoint(out: Path, logs: list[Path], procs: list) -> None:
    began = time.monotonic()
    while not list((out / "checkpoints").glob("step-*/COMMITTED")):
        assert time.monotonic() - began < HUNG, [log.read_text()[-2000:] for log in logs]
        assert all(p.poll() is None for p in procs), [log.read_text()[-2000:] for log in logs]
        time.sleep(0.1)


def test_killed_node_the_survivor_resumes_alone(two_hosts: list[Host], tmp_path: Path) -> None:
    node0, node1 = two_hosts  # node0 hosts the store and survives
    out = tmp_path / "run"
    logs = [tmp_path / f"{h.name}.log" for h in two_hosts]
    procs = [start(h, _train_argv(node0, out), log) for h, log in zip(two_hosts, logs, strict=True)]
    _wait_for_checkpoint(out, logs, procs)
    killed = node1.kill_all()
    assert killed
    ended = wait_all(procs[:1], timeout=HUNG)
    text = logs[0].read_text()
    assert ended[0] is not None and procs[0].returncode == 0, text[-4000:]
    print(f"node1 killed -> node0 finished alone after {ended[0]:.1f} s")
    assert "resumed from" in text, text[-4000:]
    # said as it happened: the lost peer, the restart, the new round's size
    assert "restarting the workers (restart 1 of 1)" in text, text[-4000:]
    assert "rendezvous round 2: 1 node(s), world size 1 (was 2)" in text, text[-4000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["world_size"] == 1
    assert metrics["resumed_from_step"] >= 4
    assert metrics["test_accuracy"] > 0.7  # 2 epochs: ~0.84 with or without the loss


def test_killed_store_host_ends_the_job_with_one_line(
    two_hosts: list[Host], tmp_path: Path
) -> None:
    node0, node1 = two_hosts  # node0 hosts the store and dies
    out = tmp_path / "run"
    logs = [tmp_path / f"{h.name}.log" for h in two_hosts]
    procs = [start(h, _train_argv(node0, out), log) for h, log in zip(two_hosts, logs, strict=True)]
    _wait_for_checkpoint(out, logs, procs)
    node0.kill_all()
    ended = wait_all(procs[1:], timeout=TIMEOUT + 30)
    text = logs[1].read_text()
    assert ended[0] is not None, text[-4000:]
    print(f"node0 (store) killed -> node1 exited after {ended[0]:.1f} s")
    assert procs[1].returncode == 1
    assert node1.pids() == []
    # Either way round, as the kill reached node1: its connection was closed under it (the
    # killed host's kernel ended it), or its next dial found nothing listening.
    said = re.search(
        r"the rendezvous store at node0:29400 (is unreachable from|closed its connection to) node1",
        text,
    )
    assert said, text[-4000:]

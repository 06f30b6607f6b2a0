"""`multigpu run --replicas 2 --cpu 1`: one group's worker killed by kill -9 mid-run.

One run (module fixture) is asserted on: the other group's longest pause between steps, the
killed group's heal from its peer, both exit codes, identical final parameters, the result
against an uninterrupted run computed here (SGD + momentum), and the listeners of every process.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from multigpu.data.sampler import ShardSampler
from multigpu.testing.listeners import listeners_of
from tests.launch._util import popen_multigpu

pytest.importorskip("torchft", reason="torchft (pip install multigpu[ft]) is not installed")

JOB = Path(__file__).parent / "scripts" / "job.py"
EPOCHS = 4
KILL_AT = 10  # group 1's committed steps before its worker is killed


def _lines(path: Path) -> list[float]:
    """The wall times of the steps a job wrote to ``path``."""
    if not path.exists():
        return []
    return [float(line.split()[0]) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("replicas")
    proc = popen_multigpu(
        ["run", "--replicas", "2", "--cpu", "1", str(JOB), str(out), str(EPOCHS)], out,
        JOB_SLEEP="0.05",
    )  # fmt: skip
    listeners: dict[int, list[str]] = {}
    deadline = time.monotonic() + 120
    try:
        while len(_lines(out / "steps-1-0")) < KILL_AT:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "group 1 did not reach its steps in 120 s"
            time.sleep(0.05)
        listeners = listeners_of(proc.pid)  # every process is up: launcher, lighthouse, groups
        os.kill(int((out / "pid-1-0-0").read_text()), signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return {"out": out, "code": proc.returncode, "err": err, "listeners": listeners}


def test_both_groups_end_well_with_the_same_parameters(killed_run: dict) -> None:
    assert killed_run["code"] == 0, killed_run["err"]
    a = torch.load(killed_run["out"] / "params-0-0.pt")
    b = torch.load(killed_run["out"] / "params-1-0.pt")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_survivor_pauses_at_most_5_seconds(killed_run: dict) -> None:
    times = _lines(killed_run["out"] / "steps-0-0")
    assert len(times) == EPOCHS * 50  # every step of the run, none twice
    assert max(b - a for a, b in itertools.pairwise(times)) <= 5.0


def test_the_killed_group_rejoins_by_healing_from_its_peer(killed_run: dict) -> None:
    err = killed_run["err"]
    assert (killed_run["out"] / "pid-1-0-1").exists()  # its agent restarted it
    assert "replica group 0: replica group(s) 1 left the quorum" in err
    assert "replica group 1: healed from replica group 0 at step" in err
    assert "no checkpoint read" in err
    assert "replica group 0: replica group(s) 1 rejoined the quorum" in err
    summary = err.strip().splitlines()[-1]  # the job's, from the launcher
    assert summary.startswith(
        "multigpu: replica groups: the job ended at step 200; group 0: 1 life, 200 steps, "
    ), summary
    assert "short-handed" in summary  # group 0 ran group 1's shares meanwhile
    assert "group 1: 2 lives" in summary and "healed 1 time(s)" in summary


def _uninterrupted(skip: int | None = None, epochs: int = EPOCHS) -> dict[str, torch.Tensor]:
    """The job's training in one process, global batch after global batch (``skip``: one left
    out, to show the comparison can fail)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(800, 8, generator=g), torch.randn(800, 1, generator=g)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler = ShardSampler(800, global_batch_size=16, rank=0, world_size=1, seed=0)
    step = 0
    for epoch in range(epochs):
        order = sampler.global_order(epoch)
        for s in range(50):
            step += 1
            if step == skip:
                continue
            batch = order[s * 16 : (s + 1) * 16]
            optimizer.zero_grad()
            F.mse_loss(model(x[batch]), y[batch]).backward()
            optimizer.step()
    return model.state_dict()


def test_sgd_momentum_equals_an_uninterrupted_run(killed_run: dict) -> None:
    got = torch.load(killed_run["out"] / "params-0-0.pt")
    plain, skipped = _uninterrupted(), _uninterrupted(skip=40)
    assert max((got[k] - plain[k]).abs().max().item() for k in got) <= 1e-5
    assert max((got[k] - skipped[k]).abs().max().item() for k in got) > 1e-4


def test_nothing_listens_on_every_interface(killed_run: dict) -> None:
    addresses = [a for found in killed_run["listeners"].values() for a in found]
    assert addresses  # the lighthouse, the stores, the manager servers, gloo
    wildcard = [a for a in addresses if a.rsplit(":", 1)[0] in ("0.0.0.0", "::")]
    assert not wildcard, killed_run["listeners"]

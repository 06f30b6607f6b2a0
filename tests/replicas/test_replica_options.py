"""`--replicas/--lighthouse/--replica-group` refused in one line (exit 2) before anything starts,
and the pure pieces: a step's shares, a child launcher's arguments, the worker's settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from multigpu.cli.main import main
from multigpu.errors import UsageError
from multigpu.launch.replica_groups import parse_lighthouse, plan_replicas, strip_our_flags
from multigpu.replicas.settings import read_replicas
from multigpu.replicas.shares import shares_of
from tests.launch._util import run_multigpu

LH = ["--lighthouse", "10.0.0.1:29510"]
REFUSED = [
    (["run", "--replicas", "0", "--cpu", "1", "job.py"], "--replicas"),
    (["run", "--replicas", "2", "--lighthouse", "nohost", "--cpu", "1", "job.py"], "HOST:PORT"),
    (["run", "--replicas", "2", "--replica-group", "2", *LH, "--cpu", "1", "job.py"], "0..1"),
    (["run", "--replicas", "2", "--replica-group", "1", "--cpu", "1", "job.py"], "--lighthouse"),
    (["run", "--replicas", "2", "--rdzv-endpoint", "127.0.0.1:29400", "job.py"], "own free port"),
    (["run", "--replicas", "2", "--nnodes", "2", "--cpu", "1", "job.py"], "--nnodes 2 with"),
    (["train", "--replicas", "3", "--cpu", "1", "--batch-size", "16"], "3 replica groups x 1"),
    (["train", "--replicas", "2", "--cpu", "1", "--strategy", "dp"], "--strategy dp"),
]


@pytest.mark.parametrize(("argv", "says"), REFUSED)
def test_refused_in_one_line(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str], tmp_path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
    assert not list(tmp_path.iterdir())  # nothing written


def test_shares_cover_the_global_batch_once() -> None:
    for groups in (1, 2, 3, 5):
        for present in range(1, groups + 1):
            runs = [s for r in range(present) for s in shares_of(r, present, groups)]
            assert sorted(runs) == list(range(groups))


def test_child_arguments() -> None:
    argv = ["--replicas", "2", "--lighthouse=h:1", "--cpu", "1", "--replica-group", "0", "job.py"]
    assert strip_our_flags(argv) == ["--cpu", "1", "job.py"]
    assert parse_lighthouse("[::1]:29510") == ("::1", 29510)
    assert plan_replicas(3, None, None).here == (0, 1, 2)
    assert plan_replicas(3, "10.0.0.1:29510", "2,0").here == (0, 2)


def test_worker_settings() -> None:
    env = {"MULTIGPU_REPLICA_GROUPS": "2", "MULTIGPU_REPLICA_GROUP": "1",
           "MULTIGPU_LIGHTHOUSE": "127.0.0.1:29510"}  # fmt: skip
    settings = read_replicas(env)
    assert settings is not None and settings.host == "127.0.0.1" and settings.heartbeat_s == 2.0
    with pytest.raises(UsageError, match="out of range"):
        read_replicas(env | {"MULTIGPU_REPLICA_GROUP": "2"})


def test_a_batch_the_groups_cannot_share_ends_in_one_line_unretried(tmp_path) -> None:
    """A user's script asks for a global batch of 16 from 3 groups of 1 process: every group
    refuses it (the message counts the groups), once — no restart — and the run says it once."""
    script = tmp_path / "batch16.py"
    script.write_text(
        "import torch\nfrom torch.utils.data import TensorDataset\nimport multigpu\n"
        "with multigpu.init() as ctx:\n"
        "    model = torch.nn.Linear(2, 1)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    model, opt = ctx.setup(model, opt)\n"
        "    ctx.loader(TensorDataset(torch.zeros(64, 2)), batch_size=16)\n"
    )
    done = run_multigpu(["run", "--replicas", "3", "--cpu", "1", str(script)], tmp_path, 240)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("multigpu: error: rank 0 on "), lines
    assert "batch_size=16 does not split into 3 replica groups x 1 process(es)" in lines[-1]
    assert [line for line in lines if "does not split" in line] == lines[-1:]
    assert "restarting" not in done.stderr
    assert "from the environment" not in done.stderr  # the groups' PET_MAX_RESTARTS is ours


def test_parameters_that_drift_apart_end_the_run_in_one_line_naming_the_groups(tmp_path) -> None:
    """Group 1 nudges a weight after step 12 (what a bug would do): the next check (every 5
    steps here) finds the groups' checksums differ and every group ends with one line."""
    loops = Path(__file__).parent / "scripts" / "loops.py"
    done = run_multigpu(
        ["run", "--replicas", "2", "--cpu", "1", str(loops), str(tmp_path), "while", "none"],
        tmp_path, 240, JOB_DRIFT_AT="12", MULTIGPU_REPLICA_CHECK_EVERY="5",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("multigpu: error: rank 0 on "), last
    assert "the replica groups' parameters differ at step 15 (group(s) 0 against group(s) 1)" in (
        last
    )
    assert "restarting" not in done.stderr
    assert not (tmp_path / "writers").exists()  # nothing written as if the run were done


def test_a_node_without_torchft_is_refused_before_any_group_starts(
    capsys: pytest.CaptureFixture[str], tmp_path, monkeypatch
) -> None:
    """Also on a node that does not host the lighthouse (it would start its groups, which
    would fail and restart): one line, exit 2, nothing written."""
    import importlib.util

    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torchft" else found(name, *a)
    )
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.py").write_text("")
    argv = ["run", "--replicas", "2", "--replica-group", "1", *LH, "--iface", "lo", "--cpu",
            "1", "job.py"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "torchft, which is not installed" in err, err
    assert [p.name for p in tmp_path.iterdir()] == ["job.py"]

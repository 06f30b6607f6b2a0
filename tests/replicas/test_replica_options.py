"""`--replicas/--lighthouse/--replica-group` refused in one line (exit 2) before anything starts,
and the pure pieces: a step's shares, a child launcher's arguments, the worker's settings."""

from __future__ import annotations

import pytest

from multigpu.cli.main import main
from multigpu.errors import UsageError
from multigpu.launch.replicas import parse_lighthouse, plan_replicas, strip_our_flags
from multigpu.replicas.settings import read_replicas
from multigpu.replicas.shares import shares_of

LH = ["--lighthouse", "10.0.0.1:29510"]
REFUSED = [
    (["run", "--replicas", "0", "--cpu", "1", "job.py"], "--replicas"),
    (["run", "--replicas", "2", "--lighthouse", "nohost", "--cpu", "1", "job.py"], "HOST:PORT"),
    (["run", "--replicas", "2", "--replica-group", "2", *LH, "--cpu", "1", "job.py"], "0..1"),
    (["run", "--replicas", "2", "--replica-group", "1", "--cpu", "1", "job.py"], "--lighthouse"),
    (["run", "--replicas", "2", "--rdzv-endpoint", "127.0.0.1:29400", "job.py"], "own free port"),
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

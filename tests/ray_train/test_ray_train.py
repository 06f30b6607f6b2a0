"""Ray Train runs a multigpu loop (issue 39, point 2), on a local Ray cluster of this machine.

One cluster for the module (it takes 8-15 s to start): ``num_cpus=4`` on CI's 2 cores, since
with ``num_cpus=2`` the 2 workers of a ``TorchTrainer`` waited over 5 minutes for resources (Ray's
own actors hold some). The same loop (``scripts/loop.py``) runs under ``TorchTrainer`` and
``multigpu run --cpu 2``: the losses agree; a worker that exits at step 45 of 60 under
``FailureConfig(max_failures=2)`` is restarted by Ray, multigpu's Checkpointer resumes at step 40,
and the run ends with the parameters of the uninterrupted one; ``log_to="ray"`` reports reach
Ray; the doctor run in a worker says it is one; docs/engines.md's example trains. 75-85 s on a
quiet machine without the docs example's ~20 s.
"""

from __future__ import annotations

import builtins
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.docs.blocks import blocks_of
from tests.launch._util import run_multigpu

pytestmark = pytest.mark.requires("module:ray")

ROOT = Path(__file__).resolve().parents[2]
LOOP = Path(__file__).resolve().parent / "scripts" / "loop.py"
TIMEOUT_S = 20
"""multigpu.init(timeout=) in the loop: the group's timeout under Ray too (Ray's own: 1800 s)."""


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """A local Ray cluster for the module, shut down (and the environment as it was) after."""
    import ray

    saved = dict(os.environ)
    # ray.init replaces builtins.print in this process (ray.experimental.tqdm_ray.safe_print):
    # restored after, or a later test in this pytest worker that pickles print's name fails.
    own_print = builtins.print
    # Short: Ray's socket paths under it must fit 107 bytes (pytest's tmp_path under xdist
    # does not); removed at the end.
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    # Ray 2.60 would write a token to ~/.ray and make every process present it.
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    workers = {
        "PYTHONPATH": str(ROOT),  # the workers import tests.ray_train.scripts.*
        "MULTIGPU_DEVICE": "cpu",
        "OMP_NUM_THREADS": "1",  # as `multigpu run --cpu 2` gives each of 2 workers on 2 cores
    }
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        _temp_dir=temp,
        runtime_env={"env_vars": workers},
        logging_level="warning",
    )
    try:
        yield
    finally:
        ray.shutdown()
        builtins.print = own_print
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(temp, ignore_errors=True)


def fit(out: Path, **config: Any) -> Any:
    """Run the loop in a TorchTrainer of 2 CPU workers; its reports go to out/reports.jsonl."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from tests.ray_train.scripts import loop
    from tests.ray_train.scripts.reports import Reports

    out.mkdir(parents=True)
    trainer = TorchTrainer(
        loop.train,
        train_loop_config={"out": str(out), "log_to": "ray", "timeout": TIMEOUT_S, **config},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(
            storage_path=str(out / "ray"),
            name="loop",
            failure_config=FailureConfig(max_failures=2),
            callbacks=[Reports(str(out / "reports.jsonl"))],
        ),
    )
    result = trainer.fit()
    assert result.error is None, result.error
    return result


@pytest.fixture(scope="module")
def uninterrupted(cluster: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The loop under TorchTrainer, run to its end (each worker runs the doctor first)."""
    out = tmp_path_factory.mktemp("ray-runs") / "uninterrupted"
    fit(out, doctor=True)
    return out


def losses(out: Path) -> dict[int, float]:
    """Rank 0's mean loss by step (a step run again after a restart: its last value)."""
    lines = (out / "losses.jsonl").read_text().splitlines()
    return {(r := json.loads(line))["step"]: r["loss"] for line in lines}


def params(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "final.pt", weights_only=True)


def facts(out: Path, rank: int, step: int) -> dict[str, Any]:
    return json.loads((out / f"facts-{rank}-{step}.json").read_text())


def test_a_loop_in_torchtrainer_adopts_rays_group_and_gives_the_losses_of_multigpu_run(
    uninterrupted: Path, tmp_path: Path
) -> None:
    config = json.dumps({"out": str(tmp_path), "timeout": TIMEOUT_S})
    done = run_multigpu(["run", "--cpu", "2", str(LOOP), config], tmp_path, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    on_ray, alone = losses(uninterrupted), losses(tmp_path)
    assert sorted(on_ray) == sorted(alone) == list(range(1, 61))
    assert max(abs(on_ray[s] - alone[s]) for s in alone) <= 1e-5, (on_ray, alone)
    ours, theirs = params(uninterrupted), params(tmp_path)
    assert all(torch.allclose(ours[k], theirs[k], atol=1e-5, rtol=0) for k in ours)
    for rank in (0, 1):  # Ray's device and group, with multigpu's timeout (not Ray's 1800 s)
        seen = facts(uninterrupted, rank, 0)
        assert (seen["source"], seen["device"], seen["timeout_s"]) == ("ray", "cpu", TIMEOUT_S)


def test_log_to_ray_reports_ctx_log_before_each_checkpoint_and_at_the_end(
    uninterrupted: Path,
) -> None:
    lines = (uninterrupted / "reports.jsonl").read_text().splitlines()
    reports = [json.loads(line) for line in lines]
    assert all(len(each) == 2 for each in reports)  # both workers, every time
    logged = losses(uninterrupted)
    # Saves in ckpt.step() of steps 20, 40, 60 (every_steps=20), before the loop logs that
    # step: each report holds the steps before; the block's end reports step 60.
    expected = [{"step": s, "loss": logged[s]} for s in (19, 39, 59, 60)]
    assert [rank0 for rank0, _ in reports] == expected


def test_a_worker_that_dies_is_restarted_by_ray_and_resumes_to_the_uninterrupted_end(
    uninterrupted: Path, tmp_path: Path
) -> None:
    out = tmp_path / "failed-once"
    fit(out, fail_at=45)
    assert (out / "failed").exists()  # rank 1 did exit at step 45
    assert facts(out, 0, 40)["resumed_at"] == 40  # Ray restarted both; the Checkpointer resumed
    ours, theirs = params(out), params(uninterrupted)
    worst = max((ours[k] - theirs[k]).abs().max().item() for k in ours)
    assert worst <= 1e-5, worst
    assert all(torch.equal(ours[k], theirs[k]) for k in ours), f"within 1e-5, not bitwise: {worst}"


def test_the_doctor_in_a_ray_worker_says_it_is_one_and_checks_rays_store(
    uninterrupted: Path,
) -> None:
    for rank in (0, 1):
        doc = json.loads((uninterrupted / f"doctor-{rank}.json").read_text())
        rows = {row["name"]: row for row in doc["checks"]}
        assert rows["environment"]["value"].startswith(f"ray: rank {rank} of 2"), rows
        assert rows["Ray Train"]["status"] == "OK", rows["Ray Train"]
        assert rows["Ray's store"]["status"] == "OK", rows["Ray's store"]
        assert "no GPU given to this worker" in rows["Ray device"]["value"]
        assert "rendezvous port" not in rows  # Ray's store holds MASTER_PORT: not "in use"


def test_log_to_ray_outside_a_ray_worker_is_refused_in_one_line() -> None:
    from multigpu.common.variables import Settings
    from multigpu.env import detect
    from multigpu.errors import UsageError
    from multigpu.session.initialize import choose_ray_report, choose_tracking

    env = detect({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    with pytest.raises(UsageError, match=r"^log_to='ray' reports through ray\.train\.report, but "
                       r"this process was started by torchrun") as e:  # fmt: skip
        choose_ray_report("csv,ray", Settings.read({}), env)
    assert "\n" not in str(e.value)
    # The rank-0 trackers are the others: ray is not one of them.
    assert choose_tracking("ray", None, None, Settings.read({}), env) is None


def test_the_docs_example_trains_in_torchtrainer(
    cluster: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Run as its own script would be, in this driver (the cluster is up: a driver of its own
    # cost 15-20 s more); its train function goes to the workers by value, as __main__'s does.
    [block] = [b for b in blocks_of(ROOT / "docs" / "engines.md") if "TorchTrainer(" in b.code]
    monkeypatch.chdir(tmp_path)
    exec(compile(block.code, block.where, "exec"), {"__name__": "__main__"})
    assert "trained" in capsys.readouterr().out
    saved = sorted(p.name for p in (tmp_path / "runs/ray/minimal/checkpoints").glob("step-*"))
    assert saved and saved[-1] >= "step-00000040", saved  # 48 steps, saved every 20

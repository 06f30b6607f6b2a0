"""GPU claims with flock: concurrent processes get different GPUs; a dead process frees its GPU."""

from __future__ import annotations

import fcntl
import multiprocessing as mp
import os
import signal
from pathlib import Path

import pytest

from multigpu.errors import LaunchError, UsageError
from multigpu.gpus import claim_gpus, parse_gpu_request
from multigpu.gpus import lock as lock_module
from multigpu.gpus.lock import gpu_lock_path

from .recorded import fake_gpu
from .workers import claim_and_hold

GPUS = [fake_gpu(0, free=20000), fake_gpu(1, free=10000)]
ONE = parse_gpu_request("1")


def test_claim_locks_until_released(tmp_path: Path) -> None:
    with claim_gpus(ONE, {}, lock_dir=tmp_path, gpus=GPUS) as first:
        assert [g.index for g in first.gpus] == [0]  # most free memory
        assert first.cuda_visible_devices == GPUS[0].uuid
        assert gpu_lock_path(tmp_path, GPUS[0]).read_text() == f"{os.getpid()}\n"
        # flock is per open file, so even this process cannot take GPU 0 twice.
        with claim_gpus(ONE, {}, lock_dir=tmp_path, gpus=GPUS) as second:
            assert [g.index for g in second.gpus] == [1]
            with pytest.raises(UsageError, match="only 0 of 2 are not locked"):
                claim_gpus(ONE, {}, lock_dir=tmp_path, gpus=GPUS)
            with pytest.raises(UsageError, match="another multigpu job has locked"):
                claim_gpus(parse_gpu_request("0,"), {}, lock_dir=tmp_path, gpus=GPUS)
    assert not first.held and not second.held
    again = claim_gpus(parse_gpu_request("auto"), {}, lock_dir=tmp_path, gpus=GPUS)
    assert [g.index for g in again.gpus] == [0, 1]
    assert again.cuda_visible_devices == f"{GPUS[0].uuid},{GPUS[1].uuid}"
    again.release()
    again.release()  # idempotent


def test_a_refusal_is_one_line_naming_the_lock_owners(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Seen on a 1-GPU machine: "GPU 0 is locked by pid N" was logged above a refusal of
    ``--gpus 3`` that had nothing to do with locks (two lines where one was promised)."""
    with claim_gpus(ONE, {}, lock_dir=tmp_path, gpus=GPUS), caplog.at_level("INFO"):
        with pytest.raises(UsageError) as too_many:
            claim_gpus(parse_gpu_request("3"), {}, lock_dir=tmp_path, gpus=GPUS)
        assert "locked by pid" not in str(too_many.value)
        with pytest.raises(UsageError) as taken:
            claim_gpus(parse_gpu_request("0,"), {}, lock_dir=tmp_path, gpus=GPUS)
        assert f"GPU 0 is locked by pid {os.getpid()}" in str(taken.value)
        assert "\n" not in str(taken.value)
        assert not [r for r in caplog.records if "locked by pid" in r.getMessage()]
        with claim_gpus(ONE, {}, lock_dir=tmp_path, gpus=GPUS):  # the choice stands: said
            assert [r for r in caplog.records if "GPU 0 is locked by pid" in r.getMessage()]


def test_lock_dir_from_environment(tmp_path: Path) -> None:
    where = tmp_path / "nested" / "locks"
    with claim_gpus(ONE, {"MULTIGPU_LOCK_DIR": str(where)}, gpus=GPUS):
        assert gpu_lock_path(where, GPUS[0]).exists()
        assert (where / "select.lock").exists()
    assert where.stat().st_mode & 0o1777 == 0o1777  # shared by every user, like /tmp


def test_unsafe_uuid_characters_in_file_name(tmp_path: Path) -> None:
    mig = fake_gpu(0).__class__(**{**vars(fake_gpu(0)), "uuid": "MIG-GPU-1234/7/0"})
    assert gpu_lock_path(tmp_path, mig).name == "gpu-MIG-GPU-1234_7_0.lock"
    with claim_gpus(ONE, {}, lock_dir=tmp_path, gpus=[mig]) as claim:
        assert claim.gpus == [mig]


def test_unusable_lock_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(LaunchError, match="MULTIGPU_LOCK_DIR"):
        claim_gpus(ONE, {}, lock_dir=blocker / "locks", gpus=GPUS)


def test_global_lock_wait_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lock_module, "SELECT_TIMEOUT_S", 0.2)
    with open(tmp_path / "select.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(LaunchError, match="stayed locked"):
            claim_gpus(ONE, {}, lock_dir=tmp_path, gpus=GPUS)
    # nothing was left locked by the failed attempt
    with claim_gpus(parse_gpu_request("2"), {}, lock_dir=tmp_path, gpus=GPUS) as claim:
        assert len(claim.gpus) == 2


@pytest.mark.timeout(120)
def test_concurrent_processes_and_dead_holder(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    done = tmp_path / "release-now"
    procs = [
        ctx.Process(
            target=claim_and_hold, args=(str(tmp_path), GPUS, "1", start, results, str(done))
        )
        for _ in range(3)
    ]
    try:
        for p in procs[:2]:
            p.start()
        start.set()  # both claim at the same moment
        got = sorted(results.get(timeout=60) for _ in range(2))
        assert got == [("ok", GPUS[0].uuid), ("ok", GPUS[1].uuid)]

        procs[2].start()  # a third job while both GPUs are held
        kind, message = results.get(timeout=60)
        assert kind == "usage" and "only 0 of 2 are not locked" in message
        procs[2].join(30)

        # Kill one holder outright (no cleanup runs): its GPU must be claimable again.
        holders = {}
        for p in procs[:2]:
            owner = "?"
            for gpu in GPUS:
                if gpu_lock_path(tmp_path, gpu).read_text().strip() == str(p.pid):
                    owner = gpu.uuid
            holders[owner] = p
        assert set(holders) == {GPUS[0].uuid, GPUS[1].uuid}
        victim = holders[GPUS[1].uuid]
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(30)
        with claim_gpus(ONE, {}, lock_dir=tmp_path, gpus=GPUS) as claim:
            assert claim.cuda_visible_devices == GPUS[1].uuid
    finally:
        done.touch()
        for p in procs:
            if p.pid is not None:
                p.join(30)
                if p.is_alive():
                    os.kill(p.pid, signal.SIGKILL)
                    p.join(5)

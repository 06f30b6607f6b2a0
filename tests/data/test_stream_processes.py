"""Streams through real gloo processes (issue 38's done-when): a plain IterableDataset over
JSON-lines shards and a Hugging Face ``datasets`` stream over the same files train a linear model
on 1 and 2 processes to the same parameters, with 0 and 2 loader workers; a run stopped at step
10 on 2 processes (a Checkpointer save, the processes exit) resumes on 1 process to the
uninterrupted parameters; rank 0 says once that the plain stream is read whole (the HF stream
is read by lanes: each rank reads its 4 of the 8 files)."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch

from multigpu.testing import run_distributed
from tests.data import stream_workers

FILES, PER_FILE = 8, 25  # 200 records: 25 global batches of 8 an epoch
STEPS, STOP = 30, 10  # past the first epoch: the resume crosses into epoch 1
SOURCES = ("plain", "hf") if importlib.util.find_spec("datasets") else ("plain",)
WORKERS = (0, 2)
hf_marks = [pytest.param("hf", marks=pytest.mark.requires("module:datasets"))]


def params(result: dict[str, Any], source: str, workers: int) -> dict[str, torch.Tensor]:
    index = [(s, w) for s in SOURCES for w in WORKERS].index((source, workers))
    return result["runs"][index]["params"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Uninterrupted on 1 and 2 processes (each source, 0 and 2 workers); stopped on 2
    processes; resumed on 1 process with the other number of workers."""
    paths = stream_workers.write_shards(tmp_path_factory.mktemp("shards"), FILES, PER_FILE)
    ckpt = tmp_path_factory.mktemp("ckpt")
    env = stream_workers.HF_ENV
    whole = [{"source": s, "workers": w, "steps": STEPS} for s in SOURCES for w in WORKERS]
    out: dict[str, Any] = {
        n: run_distributed(stream_workers.train, n, args=(paths, whole), env=env, timeout=240)
        for n in (1, 2)
    }
    stop = [
        {"source": s, "workers": 0, "steps": STEPS, "stop_at": STOP, "ckpt": str(ckpt / s)}
        for s in SOURCES
    ]
    out["stopped"] = run_distributed(stream_workers.train, 2, args=(paths, stop), env=env)
    resume = [{**run, "stop_at": None, "workers": 2} for run in stop]
    out["resumed"] = run_distributed(stream_workers.train, 1, args=(paths, resume), env=env)
    return out


def largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("source", ["plain", *hf_marks])
def test_one_and_two_processes_with_and_without_workers_train_alike(
    runs: dict[str, Any], source: str
) -> None:
    one = params(runs[1][0], source, 0)
    assert float(one["weight"].abs().sum()) > 0
    for n in (1, 2):
        ranks = runs[n]
        for rank in ranks:
            for run in rank["runs"]:
                assert run["step"] == STEPS and run["epoch"] == 1
        for workers in WORKERS:
            assert largest_difference(params(ranks[0], source, workers), one) < 1e-5, (n, workers)
        # The same world size: the same batches with or without workers, bit for bit.
        assert largest_difference(params(ranks[0], source, 2), params(ranks[0], source, 0)) == 0
    index = [(s, w) for s in SOURCES for w in WORKERS].index((source, 0))
    seen_one = runs[1][0]["runs"][index]["seen"]
    seen_two = [i for rank in runs[2] for i in rank["runs"][index]["seen"]]
    assert len(seen_one) == STEPS * stream_workers.GLOBAL_BATCH
    assert sorted(seen_two) == sorted(seen_one)
    assert sorted(seen_one[: FILES * PER_FILE]) == list(range(FILES * PER_FILE))  # epoch 0


@pytest.mark.parametrize("source", ["plain", *hf_marks])
def test_stopped_at_step_10_on_two_processes_resumes_on_one_to_the_uninterrupted_result(
    runs: dict[str, Any], source: str
) -> None:
    index = SOURCES.index(source)
    stopped = [rank["runs"][index] for rank in runs["stopped"]]
    resumed = runs["resumed"][0]["runs"][index]
    uninterrupted = params(runs[1][0], source, 0)
    assert [r["step"] for r in stopped] == [STOP, STOP]
    assert resumed["step"] == STEPS
    assert len(resumed["seen"]) == (STEPS - STOP) * stream_workers.GLOBAL_BATCH
    seen = [i for r in stopped for i in r["seen"]] + resumed["seen"]
    whole = runs[1][0]["runs"][SOURCES.index(source) * len(WORKERS)]["seen"]
    assert sorted(seen) == sorted(whole)
    assert resumed["seen"] == whole[STOP * stream_workers.GLOBAL_BATCH :]  # in order
    assert largest_difference(stopped[0]["params"], uninterrupted) > 1e-3  # it did stop
    assert largest_difference(resumed["params"], uninterrupted) < 1e-5


def test_rank_0_says_once_that_the_plain_stream_is_read_whole(runs: dict[str, Any]) -> None:
    """The plain stream has no shards; the HF one is read by lanes (its 8 files in 8 lanes, 4
    for each of the 2 ranks), which needs no word."""
    expected = [
        "the stream JsonLines is read whole by each of the 2 ranks (it has no shards "
        "multigpu can split); RecordFiles(...) reads only each rank's share of files"
    ]
    assert runs[2][0]["said"] == expected  # four loaders, one line
    assert runs[2][1]["said"] == []
    assert runs[1][0]["said"] == []  # one process reads it whole anyway

"""RecordFiles through real gloo processes: the same global batches on 1 and 2 processes with
0 and 2 loader workers, each rank reading about 1/N of the bytes, the same trained parameters on
1 and 2 processes, and a run stopped at step 10 on 2 processes resumed on 1 process (2 loader
workers) to the uninterrupted parameters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from multigpu.testing import run_distributed
from tests.data import record_workers

FILES, PER_FILE = 8, 25  # 200 records, 25 global batches of 8 a (shuffled) epoch


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    directory = tmp_path_factory.mktemp("shards")
    return directory, record_workers.write_shards(directory, FILES, PER_FILE)


def global_steps(per_rank: list[list[list[int]]]) -> list[list[int]]:
    steps = max(len(b) for b in per_rank)
    return [[i for b in per_rank if s < len(b) for i in b[s]] for s in range(steps)]


def test_same_global_batches_at_any_world_size_and_workers_and_a_share_of_the_bytes(
    data: tuple[Path, int],
) -> None:
    directory, total = data
    runs = {
        ws: run_distributed(record_workers.batches, ws, args=(str(directory), [0, 2]))
        for ws in (1, 2)
    }
    reference = None
    for ws, ranks in runs.items():
        for workers in (0, 2):
            epochs = [global_steps([r[f"epochs_{workers}"][e] for r in ranks]) for e in (0, 1)]
            assert len(epochs[0]) == FILES * PER_FILE // record_workers.GLOBAL_BATCH
            assert sorted(i for step in epochs[0] for i in step) == list(range(FILES * PER_FILE))
            assert epochs[0] != epochs[1]  # reshuffled
            reference = reference or epochs
            assert epochs == reference, (ws, workers)
    # Read locality: a step's records come from one window of 4 files, but the one step that
    # crosses from the first window (100 records) to the second.
    files_per_step = [len({i // PER_FILE for i in step}) for step in reference[0]]
    assert sum(n > 4 for n in files_per_step) <= 1, files_per_step
    assert runs[1][0]["index_bytes"] == total
    records = runs[1][0]["record_bytes"]
    for r in runs[2]:
        assert abs(r["index_bytes"] / (total / 2) - 1) < 0.1, r["index_bytes"]
        assert abs(r["record_bytes"] / (records / 2) - 1) < 0.1, r["record_bytes"]


def close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


def test_training_is_the_same_on_one_and_two_processes_and_resumes_across(
    data: tuple[Path, int], tmp_path: Path
) -> None:
    directory = str(data[0])
    ckpt = str(tmp_path / "ckpt")
    steps = 30  # more than an epoch (25 steps): the resume crosses into epoch 1
    one = run_distributed(record_workers.train, 1, args=(directory, None, steps, None, 0))[0]
    two = run_distributed(record_workers.train, 2, args=(directory, None, steps, None, 0))
    assert close(one["params"], two[0]["params"])
    assert one["params"]["weight"].abs().sum() > 0
    stopped = run_distributed(record_workers.train, 2, args=(directory, ckpt, steps, 10, 0))
    assert stopped[0]["step"] == 10
    resumed: Any = run_distributed(record_workers.train, 1, args=(directory, ckpt, steps, None, 2))
    assert resumed[0]["step"] == steps
    seen = sorted(stopped[0]["seen"] + stopped[1]["seen"]) + resumed[0]["seen"]
    assert sorted(stopped[0]["seen"] + stopped[1]["seen"] + resumed[0]["seen"]) == sorted(
        one["seen"]
    )
    assert len(seen) == steps * record_workers.GLOBAL_BATCH
    assert close(resumed[0]["params"], one["params"])
    assert not close(stopped[0]["params"], one["params"])


def test_a_checkpoint_over_changed_files_is_refused_at_resume_naming_the_file(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    record_workers.write_shards(data, 4, 10)
    said = run_distributed(
        record_workers.resume_over_a_changed_file, 1, args=(str(data), str(tmp_path / "ckpt"))
    )[0]
    assert said.startswith(
        "data file part-002.jsonl changed since the checkpoint was saved (858 bytes, 10 records"
    ), said
    assert said.endswith("resume over the files the checkpoint was saved with, or start a new run")

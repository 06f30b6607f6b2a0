"""2-D meshes on 4 CPU processes (gloo): tensor parallel + FSDP on (dp_shard=2, tp=2), and HSDP
on (dp_replicate=2, dp_shard=2). Each trains like one process (50 steps, SGD with momentum:
parameters within 1e-5 max relative), resumes from its DCP checkpoint through
``ctx.checkpointer`` and ends where the straight run ended; under TP the two ranks of a TP group
read the same batches."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from multigpu.testing import run_distributed
from tests.strategies import tensor_parallel_workers as workers


def _max_relative(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-12)) for k in a)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    directory = tmp_path_factory.mktemp("two_d")
    return run_distributed(workers.two_d, world_size=4, args=(str(directory),), timeout=240)


@pytest.mark.parametrize("kind", workers.KINDS)
def test_a_2x2_mesh_trains_like_one_process_and_resumes_where_it_left(
    results: list[dict[str, Any]], kind: str
) -> None:
    run = results[0][kind]
    names = ("dp_shard", "tp") if kind == "tp" else ("dp_replicate", "dp_shard")
    assert run["mesh"] == (names, (2, 2))
    straight = run["straight"]["state"]
    assert _max_relative(straight, results[0]["reference"]["state"]) < 1e-5
    norms, expected = run["straight"]["norms"], results[0]["reference"]["norms"]
    assert max(abs(a - b) / b for a, b in zip(norms, expected, strict=True)) < 1e-5
    assert sum(n > workers.CLIP for n in expected) > workers.STEPS // 2  # clipping acted
    assert run["resumed"]["resumed"] == workers.HALF
    assert run["straight"]["evaluated"] == len(workers.data())  # each sample counted once
    assert _max_relative(run["resumed"]["state"], straight) < 1e-6


@pytest.mark.parametrize("kind", workers.KINDS)
def test_tensor_parallel_ranks_share_their_batches_and_data_ranks_split_them(
    results: list[dict[str, Any]], kind: str
) -> None:
    seen = [r[kind]["straight"]["seen"] for r in results]
    if kind == "tp":  # ranks 0,1 form one TP group, 2,3 the other: (dp 0), (dp 1)
        assert seen[0] == seen[1] and seen[2] == seen[3]
        assert len(seen[0]) == workers.STEPS * workers.BATCH // 2
        assert not set(seen[0][:8]) & set(seen[2][:8])
    else:  # HSDP: four data-parallel ranks, four quarters of each global batch
        assert len(seen[0]) == workers.STEPS * workers.BATCH // 4
        assert all(not set(seen[a][:4]) & set(seen[b][:4]) for a in range(4) for b in range(a))

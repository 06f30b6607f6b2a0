"""A checkpoint written by N processes under one strategy resumes on M under another.

Saved by {ddp on 2, fsdp on 2, fsdp on 1} at a mid-epoch step, resumed by {fsdp 1, fsdp 2,
ddp 1, ddp 2}: every resumed run starts at the saved step with the very next global batch,
ends within rounding of an uninterrupted run, and bitwise equal to it on the same world size
and strategy. Four process starts in all (each worker runs many runs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from multigpu.data.sampler import ShardSampler
from multigpu.testing import run_distributed
from tests.checkpoint import reshard_workers as w
from tests.strategies import fsdp_workers

SOURCES = ["ddp2", "fsdp2", "fsdp1"]


def _max_relative(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(((a[k] - b[k]).abs().max() / (b[k].abs().max() + 1e-12)).item() for k in b)


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = str(tmp_path_factory.mktemp("reshard"))
    saved2, _ = run_distributed(w.save_runs, world_size=2, args=(root,))
    (saved1,) = run_distributed(w.save_runs, world_size=1, args=(root,))
    (resumed1,) = run_distributed(w.resume_runs, world_size=1, args=(root, SOURCES))
    resumed2, _ = run_distributed(w.resume_runs, world_size=2, args=(root, SOURCES))
    return {
        "full": {
            ("fsdp", 2): saved2["fsdp"],
            ("ddp", 2): saved2["ddp"],
            ("fsdp", 1): saved1["fsdp"],
            ("ddp", 1): saved1["ddp"],
        },
        "resumed": {
            **{(k, 1): v for k, v in resumed1.items()},
            **{(k, 2): v for k, v in resumed2.items()},
        },
        "root": Path(root),
    }


def test_every_saved_run_resumes_under_every_strategy_and_world_size(
    matrix: dict[str, Any],
) -> None:
    order = ShardSampler(
        len(fsdp_workers._data("lm")), global_batch_size=fsdp_workers.BATCH, rank=0,
        world_size=1, shuffle=True, seed=0,
    ).global_order(0)  # fmt: skip
    next_batch = order[w.STOP * fsdp_workers.BATCH : (w.STOP + 1) * fsdp_workers.BATCH].tolist()
    assert len(matrix["resumed"]) == 2 * 2 * len(SOURCES)
    for (label, size), run in matrix["resumed"].items():
        source, target = label.split("->")
        assert run["resumed"] == w.STOP, label
        assert [i for part in run["first"] for i in part] == next_batch, (label, size)
        full = matrix["full"][(target, size)]["state"]
        same = source == f"{target}{size}"
        if same:  # the same strategy and world size: nothing differs but the interruption
            assert all(torch.equal(run["state"][k], full[k]) for k in full), (label, size)
        else:
            assert _max_relative(run["state"], full) <= 1e-5, (label, size)
    assert (
        _max_relative(matrix["full"][("fsdp", 2)]["state"], matrix["full"][("ddp", 1)]["state"])
        <= 1e-5
    )


def test_sharded_checkpoints_hold_one_file_per_rank(matrix: dict[str, Any]) -> None:
    two = sorted(p.name for p in (matrix["root"] / "fsdp2" / "step-00000009").glob("*.distcp"))
    one = sorted(p.name for p in (matrix["root"] / "fsdp1" / "step-00000009").glob("*.distcp"))
    assert two == ["__0_0.distcp", "__1_0.distcp"] and one == ["__0_0.distcp"]

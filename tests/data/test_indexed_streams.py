"""A litdata ``StreamingDataset`` through ``ctx.loader`` on real gloo processes: iterated, it
gives each rank only its own part (litdata splits by rank itself), so multigpu deals it by index
(``multigpu.data.indexed_streams``): the same global batches on 1 and 2 processes, with and
without loader workers, and a position that resumes on another world size."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from multigpu.data.indexed_streams import IndexedView, splits_itself
from multigpu.testing import run_distributed

pytestmark = pytest.mark.requires("module:litdata")

SAMPLES, BATCH = 96, 8


def sample(i: int) -> dict[str, Any]:
    return {"id": i, "x": torch.full((2,), float(i))}


@pytest.fixture(scope="module")
def optimized(tmp_path_factory: pytest.TempPathFactory) -> str:
    from litdata import optimize

    out = tmp_path_factory.mktemp("litdata")
    optimize(
        fn=sample, inputs=list(range(SAMPLES)), output_dir=str(out), chunk_bytes="2KB",
        num_workers=1, mode="overwrite",
    )  # fmt: skip
    return str(out)


def seen(directory: str, workers: int, stop_at: int | None = None) -> dict[str, Any]:
    """The ids of this rank's batches through ctx.loader, its loader state at ``stop_at`` steps,
    and the ids litdata gives this rank when iterated directly."""
    from litdata import StreamingDataset

    import multigpu

    with multigpu.init(seed=0) as ctx:
        loader = ctx.loader(StreamingDataset(directory), batch_size=BATCH, num_workers=workers)
        batches, state = [], None
        for step, batch in enumerate(loader):
            batches.append(batch["id"].tolist())
            if step + 1 == stop_at:
                state = loader.state_dict()
                break
        direct = [s["id"] for s in StreamingDataset(directory)]
    return {"batches": batches, "state": state, "direct": direct}


def resumed(directory: str, state: dict[str, Any]) -> list[list[int]]:
    from litdata import StreamingDataset

    import multigpu

    with multigpu.init(seed=0) as ctx:
        loader = ctx.loader(StreamingDataset(directory), batch_size=BATCH)
        loader.load_state_dict(state)
        return [batch["id"].tolist() for batch in loader]


def test_the_same_global_batches_on_one_and_two_processes_and_a_resume(optimized: str) -> None:
    from litdata import StreamingDataset

    assert splits_itself(StreamingDataset(optimized))
    one = run_distributed(seen, 1, args=(optimized, 0))[0]
    assert len(one["batches"]) == SAMPLES // BATCH
    assert sorted(i for b in one["batches"] for i in b) == list(range(SAMPLES))
    two = run_distributed(seen, 2, args=(optimized, 2))
    steps = [a + b for a, b in zip(two[0]["batches"], two[1]["batches"], strict=True)]
    assert steps == one["batches"]
    # Why: iterated directly, litdata gives each of the 2 ranks a different half.
    direct = [r["direct"] for r in two]
    assert set(direct[0]).isdisjoint(direct[1]) and len(direct[0]) < SAMPLES
    assert len(set(direct[0] + direct[1])) == SAMPLES
    stopped = run_distributed(seen, 2, args=(optimized, 0, 5))
    assert stopped[0]["state"]["cursor"] == 5 * BATCH
    rest = run_distributed(resumed, 1, args=(optimized, stopped[0]["state"]))[0]
    assert rest == one["batches"][5:]


def test_the_view_is_map_style() -> None:
    view = IndexedView(list(range(5)))
    assert len(view) == 5 and view[3] == 3 and not splits_itself(view)
    assert repr(view) == "IndexedView(list)"

"""WebDataset pipelines through ``ctx.loader`` on real gloo processes: a pipeline every rank reads
whole (``nodesplitter=None``) gives the same global batches on 1 and 2 processes, with loader
workers too; what would give the ranks different streams is refused in one line
(``multigpu.data.webdataset_stream``)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from multigpu.data import make_loader
from multigpu.errors import UsageError
from multigpu.testing import run_distributed

pytestmark = pytest.mark.requires("module:webdataset")

SHARDS, PER_SHARD, BATCH = 4, 12, 8


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    import webdataset as wds

    out = tmp_path_factory.mktemp("wds")
    paths = []
    for s in range(SHARDS):
        path = out / f"shard-{s}.tar"
        with wds.TarWriter(str(path)) as sink:
            for k in range(PER_SHARD):
                i = s * PER_SHARD + k
                sink.write({"__key__": f"{i:05d}", "id.txt": str(i), "x.npy": _npy(i)})
        paths.append(str(path))
    return paths


def _npy(i: int) -> bytes:
    import numpy

    buffer = io.BytesIO()
    numpy.save(buffer, numpy.full(3, i, dtype=numpy.float32))
    return buffer.getvalue()


def _collate(samples: list[dict[str, Any]]) -> list[int]:
    return [int(s["id.txt"]) for s in samples]


def seen(urls: list[str], workers: int, how: str) -> dict[str, Any]:
    import webdataset as wds

    import multigpu

    with multigpu.init(seed=0) as ctx:
        try:
            if how == "default":
                stream = wds.WebDataset(urls, shardshuffle=False)
            elif how == "own-seed":  # what WebDataset(shardshuffle=n) without seed= may draw
                stream = wds.WebDataset(urls, shardshuffle=4, nodesplitter=None, seed=ctx.rank)
            else:
                stream = wds.WebDataset(urls, shardshuffle=False, nodesplitter=None)
            loader = ctx.loader(
                stream, batch_size=BATCH, num_workers=workers, buffer_size=10, collate_fn=_collate
            )
            return {"batches": list(loader)}
        except UsageError as e:
            return {"error": str(e)}


def test_the_same_global_batches_on_one_and_two_processes(urls: list[str]) -> None:
    one = run_distributed(seen, 1, args=(urls, 0, "whole"))[0]["batches"]
    assert len(one) == SHARDS * PER_SHARD // BATCH
    assert sorted(i for b in one for i in b) == list(range(SHARDS * PER_SHARD))
    two = run_distributed(seen, 2, args=(urls, 2, "whole"))
    assert [a + b for a, b in zip(two[0]["batches"], two[1]["batches"], strict=True)] == one


@pytest.mark.parametrize(
    ("how", "said"),
    [
        ("default", "default nodesplitter (single_node_only) stops a run of 2 processes"),
        ("own-seed", "shuffles its shards with a seed each process drew itself"),
    ],
)
def test_a_pipeline_each_rank_would_read_otherwise_is_refused_on_every_rank(
    urls: list[str], how: str, said: str
) -> None:
    ranks = run_distributed(seen, 2, args=(urls, 0, how))
    assert all(said in r.get("error", "") for r in ranks), ranks


def test_a_node_split_or_an_unseeded_shuffle_is_refused_as_the_loader_is_made(
    urls: list[str],
) -> None:
    import webdataset as wds

    split = wds.WebDataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node)
    with pytest.raises(UsageError, match=r"nodesplitter=split_by_node\) gives each rank other"):
        make_loader(split, batch_size=BATCH, rank=0, world_size=1)
    unseeded = wds.WebDataset(urls, shardshuffle=False, nodesplitter=None).shuffle(10)
    with pytest.raises(UsageError, match=r"shuffles \(10\) without a seed"):
        make_loader(unseeded, batch_size=BATCH, rank=0, world_size=1)
    seeded = wds.WebDataset(urls, shardshuffle=False, nodesplitter=None).shuffle(10, seed=1)
    assert len(list(make_loader(seeded, batch_size=BATCH, rank=0, world_size=1))) == 6
    assert Path(urls[0]).exists()

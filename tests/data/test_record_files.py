"""RecordFiles in one process: formats, bad records in one line, the order, the fingerprint that
refuses a resume over changed, missing or new files."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from multigpu.data import DistributedLoader, RecordFiles, make_loader
from multigpu.errors import DataError, UsageError
from tests.data import record_workers


def test_records_of_every_format_by_index(tmp_path: Path) -> None:
    record_workers.write_shards(tmp_path / "j", 3, 5)
    ds = RecordFiles(tmp_path / "j")
    assert len(ds) == 15 and [ds[i]["id"] for i in (0, 7, 14, -1)] == [0, 7, 14, 14]
    (tmp_path / "t.txt").write_text("first\n\nthird é\nlast, no newline")
    text = RecordFiles(str(tmp_path / "*.txt"))
    assert [text[i] for i in range(len(text))] == ["first", "", "third é", "last, no newline"]
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": list(range(10))}), tmp_path / "p.parquet", row_group_size=3)
    rows = RecordFiles([tmp_path / "p.parquet"], transform=lambda r: r["id"])
    assert [rows[i] for i in range(10)] == list(range(10))
    with pytest.raises(IndexError):
        ds[15]


def test_reading_a_record_reads_its_bytes_only(tmp_path: Path) -> None:
    total = record_workers.write_shards(tmp_path, 2, 50)
    ds = RecordFiles(tmp_path)
    len(ds)
    assert ds.bytes_read == total  # the index: every byte once, alone
    record = ds[60]
    assert ds.bytes_read - total == len(json.dumps(record))


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"id": 0}\n{"id": 1,\n', r"part\.jsonl, line 2: invalid JSON"),
        ('{"id": 0}\n[1, 2]\n', r"part\.jsonl, line 2: a JSON list, expected an object"),
        ('{"id": 0}\n{"id": 1', r"line 2 \(the last line, without its newline: truncated\?\)"),
    ],
)
def test_a_bad_record_is_one_line_naming_file_and_line(
    tmp_path: Path, content: str, expected: str
) -> None:
    (tmp_path / "part.jsonl").write_text(content)
    with pytest.raises(DataError, match=expected + ".*on_bad='skip'") as e:
        len(RecordFiles(tmp_path))
    assert "\n" not in str(e.value)
    skipping = RecordFiles(tmp_path, on_bad="skip")
    assert len(skipping) == 1 and skipping.bad_records == 1 and skipping[0] == {"id": 0}


def test_bad_arguments_are_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no file, directory or matching glob"):
        RecordFiles(tmp_path / "nothing*.jsonl")
    with pytest.raises(UsageError, match="found no .jsonl"):
        RecordFiles(tmp_path)
    (tmp_path / "a.bin").write_bytes(b"x")
    with pytest.raises(UsageError, match="cannot tell the format.*pass format="):
        RecordFiles(tmp_path / "a.bin")
    with pytest.raises(UsageError, match="on_bad='ignore'; expected 'raise' or 'skip'"):
        RecordFiles(tmp_path / "a.bin", format="text", on_bad="ignore")
    with pytest.raises(UsageError, match="format='csv'"):
        RecordFiles(tmp_path / "a.bin", format="csv")


def test_the_order_is_a_seeded_permutation_by_windows_of_files(tmp_path: Path) -> None:
    record_workers.write_shards(tmp_path, 8, 10)
    ds = RecordFiles(tmp_path, window=2)
    order = ds.global_order(3, 0)
    assert sorted(order.tolist()) == list(range(80))
    assert torch.equal(order, RecordFiles(tmp_path, window=2).global_order(3, 0))
    assert not torch.equal(order, ds.global_order(3, 1))
    for w in range(4):  # each run of 20 positions: the records of 2 files
        assert len({int(i) // 10 for i in order[w * 20 : (w + 1) * 20]}) == 2
    loader = make_loader(ds, batch_size=8, rank=0, world_size=1, seed=3)
    assert torch.equal(loader.sampler.global_order(0), order)


def _loader(directory: Path) -> DistributedLoader:
    return make_loader(
        RecordFiles(directory, transform=record_workers.as_tensors),
        batch_size=4,
        rank=0,
        world_size=1,
    )


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda d: (d / "part-001.jsonl").write_text('{"id": 1}\n' * 10),
            r"data file part-001\.jsonl changed since the checkpoint was saved \(\d+ bytes",
        ),
        (
            lambda d: (d / "part-001.jsonl").unlink(),
            r"data file part-001\.jsonl of the checkpoint is missing now",
        ),
        (
            lambda d: (d / "part-009.jsonl").write_text('{"id": 1}\n'),
            r"data file part-009\.jsonl is new since the checkpoint was saved",
        ),
    ],
)
def test_a_resume_over_changed_files_is_refused_naming_the_file(
    tmp_path: Path, change: Callable[[Path], object], expected: str
) -> None:
    record_workers.write_shards(tmp_path, 3, 10)
    loader = _loader(tmp_path)
    next(iter(loader))
    state = loader.state_dict()
    assert [row[0] for row in state["files"]] == [f"part-00{i}.jsonl" for i in range(3)]
    _loader(tmp_path).load_state_dict(state)  # unchanged: fine
    change(tmp_path)
    with pytest.raises(DataError, match=expected + ".*resume over the files") as e:
        _loader(tmp_path).load_state_dict(state)
    assert "\n" not in str(e.value)


def test_the_replica_groups_sampler_keeps_the_files_order_and_fingerprint(tmp_path: Path) -> None:
    from multigpu.replicas.shares import replica_sampler

    record_workers.write_shards(tmp_path, 6, 10)
    ds = RecordFiles(tmp_path, window=2)
    sampler = make_loader(ds, batch_size=8, rank=0, world_size=1, seed=4).sampler
    wide = replica_sampler(sampler, groups=2, group=1)
    assert torch.equal(wide.global_order(0), ds.global_order(4, 0))
    assert wide.state_dict()["files"] == ds.data_fingerprint()


def _write_tar(path: Path, first: int, samples: int) -> None:
    import io
    import tarfile

    with tarfile.open(path, "w") as archive:
        for k in range(first, first + samples):
            for ext, body in (("json", json.dumps({"id": k}).encode()), ("txt", b"x" * k * 90)):
                info = tarfile.TarInfo(f"train/{k:05d}.{ext}")
                info.size = len(body)
                archive.addfile(info, io.BytesIO(body))


def test_tar_shards_give_webdataset_samples_and_a_cut_off_one_is_bad(tmp_path: Path) -> None:
    for f in range(2):
        _write_tar(tmp_path / f"shard-{f}.tar", f * 5, 5)
    ds = RecordFiles(tmp_path)
    assert len(ds) == 10
    assert ds.bytes_read < sum(p.stat().st_size for p in tmp_path.iterdir()) / 2  # headers only
    sample = ds[7]
    assert sample["__key__"] == "train/00007" and json.loads(sample["json"]) == {"id": 7}
    assert sample["txt"] == b"x" * 630
    cut = tmp_path / "shard-1.tar"
    cut.write_bytes(cut.read_bytes()[:3000])
    with pytest.raises(
        DataError, match=r"shard-1\.tar, sample 2 \(byte \d+\): (truncated|bad tar)"
    ):
        len(RecordFiles(tmp_path))
    skipping = RecordFiles(tmp_path, on_bad="skip")
    assert len(skipping) == 6 and skipping.bad_records == 1


def test_an_index_dir_spares_the_next_run_the_index_reading(tmp_path: Path) -> None:
    data, cache = tmp_path / "data", tmp_path / "cache"
    total = record_workers.write_shards(data, 3, 10)
    first = RecordFiles(data, index_dir=cache)
    assert len(first) == 30 and first.bytes_read == total
    again = RecordFiles(data, index_dir=cache)
    assert len(again) == 30 and again.bytes_read == 0
    assert again.data_fingerprint() == first.data_fingerprint() and again[13] == first[13]
    changed = data / "part-001.jsonl"
    changed.write_text(changed.read_text() + '{"id": 99}\n')
    third = RecordFiles(data, index_dir=cache)
    assert len(third) == 31 and third.bytes_read == changed.stat().st_size  # that file only
    (data / "part-002.jsonl").write_text('{"id": 0}\n[]\n')
    assert len(RecordFiles(data, index_dir=cache, on_bad="skip")) == 22
    with pytest.raises(DataError, match=r"part-002\.jsonl, line 2: a JSON list"):
        len(RecordFiles(data, index_dir=cache))  # the cached index still says it


def test_parquet_is_shuffled_by_windows_of_row_groups_each_decoded_once(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    for f in range(3):
        ids = list(range(f * 20, f * 20 + 20))
        pq.write_table(pa.table({"id": ids}), tmp_path / f"p{f}.parquet", row_group_size=5)
    ds = RecordFiles(tmp_path, window=2, transform=lambda r: r["id"])
    order = ds.global_order(0, 0).tolist()
    assert sorted(order) == list(range(60))
    for w in range(6):  # each run of 10 positions: the rows of 2 row groups
        assert len({i // 5 for i in order[w * 10 : (w + 1) * 10]}) == 2
    index = ds.bytes_read
    assert ds.__getitems__(order) == order
    groups = sum(
        pq.ParquetFile(p).metadata.row_group(g).column(0).total_compressed_size
        for p in ds.paths
        for g in range(4)
    )
    assert ds.bytes_read - index == groups  # each row group decoded once in the epoch

"""Token files: text, JSON lines, a Hugging Face tokenizer -> packed, boundary-masked sequences."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from multigpu.common.text_sources import check_sources, list_sources
from multigpu.data import IGNORE_INDEX, PackedSequences, TokenFile, build_token_file, token_file
from multigpu.errors import DataError, UsageError


def _jsonl(path: Path, texts: list[str], field: str = "text") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({field: t, "id": i}) + "\n" for i, t in enumerate(texts)))
    return path


def test_documents_are_concatenated_and_a_target_that_starts_a_document_is_masked(
    tmp_path: Path,
):
    _jsonl(tmp_path / "d" / "b.jsonl", ["fgh", "", "ij"])  # the empty one is no document
    _jsonl(tmp_path / "d" / "a.jsonl", ["abcde"])
    (tmp_path / "d" / "c.txt").write_text("klmnopq")  # a whole file is one document
    (tmp_path / "d" / "notes.md").write_text("not read")  # not a known format: left out
    tokens = TokenFile(build_token_file([tmp_path / "d"], cache_dir=tmp_path / "cache"))
    assert bytes(tokens.tokens.tolist()) == b"abcdefghijklmnopq"  # a.jsonl, b.jsonl, c.txt
    assert tokens.starts.tolist() == [0, 5, 8, 10] and tokens.documents == 4
    assert tokens.vocab_size == 256 and tokens.tokens.dtype == np.uint8
    seqs = PackedSequences(tokens, 4)
    assert len(seqs) == 4  # (17 - 1) // 4
    got = [(bytes(x.tolist()), y.tolist()) for x, y in (seqs[i] for i in range(4))]
    m = IGNORE_INDEX
    assert got == [
        (b"abcd", [ord("b"), ord("c"), ord("d"), ord("e")]),
        (b"efgh", [m, ord("g"), ord("h"), m]),  # f and i start documents: not predicted
        (b"ijkl", [ord("j"), m, ord("l"), ord("m")]),  # k starts c.txt
        (b"mnop", [ord("n"), ord("o"), ord("p"), ord("q")]),
    ]
    assert seqs[0][0].dtype == seqs[0][1].dtype == torch.int64
    # a range of the tokens (the job's validation tail), and an evaluation subset of it
    tail = PackedSequences(tokens, 3, start=9, indices=[1])
    x, _ = tail[0]
    assert bytes(x.tolist()) == b"mno" and len(PackedSequences(tokens, 3, start=9)) == 2


def test_the_cache_is_keyed_by_the_sources_and_a_second_build_reads_nothing(tmp_path: Path):
    src = _jsonl(tmp_path / "a.jsonl", ["one", "two"])
    cache = tmp_path / "cache"
    first = build_token_file([src], cache_dir=cache)
    stamp = (first / "tokens.bin").stat().st_mtime_ns
    assert build_token_file([src], cache_dir=cache) == first
    assert (first / "tokens.bin").stat().st_mtime_ns == stamp  # found, not rebuilt
    assert [p.name for p in cache.iterdir()] == [first.name]  # no temporary directory left
    _jsonl(src, ["one", "two", "three"])  # changed: another key
    os.utime(src, ns=(stamp + 10**9, stamp + 10**9))
    second = build_token_file([src], cache_dir=cache)
    assert second != first and TokenFile(second).documents == 3
    other_field = _jsonl(tmp_path / "b.jsonl", ["xyz"], field="body")
    third = build_token_file([other_field], text_field="body", cache_dir=cache)
    assert bytes(TokenFile(third).tokens.tolist()) == b"xyz"
    meta = json.loads((third / "meta.json").read_text())
    assert meta["tokens"] == 3 and meta["sha256"] == TokenFile(third).sha256


def test_a_hugging_face_tokenizer_from_a_directory_ends_each_document_with_eos(tmp_path: Path):
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    vocab = {"[UNK]": 0, "</s>": 1, "the": 2, "cat": 3, "sat": 4}
    model = tokenizers.models.WordLevel(vocab, unk_token="[UNK]")
    raw = tokenizers.Tokenizer(model)
    raw.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=raw, unk_token="[UNK]", eos_token="</s>"
    )
    fast.save_pretrained(tmp_path / "tok")
    src = _jsonl(tmp_path / "a.jsonl", ["the cat", "cat sat dog"])
    built = build_token_file([src], tokenizer=str(tmp_path / "tok"), cache_dir=tmp_path / "c")
    tokens = TokenFile(built)
    assert tokens.tokens.tolist() == [2, 3, 1, 3, 4, 0, 1]  # EOS after each, dog unknown
    assert tokens.starts.tolist() == [0, 3] and tokens.vocab_size == 5
    x, y = PackedSequences(tokens, 4)[0]
    assert x.tolist() == [2, 3, 1, 3] and y.tolist() == [3, 1, IGNORE_INDEX, 4]
    assert json.loads((built / "meta.json").read_text())["eos_id"] == 1


def test_bad_sources_are_one_line_naming_the_file_and_what_would_do(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "e.jsonl").write_text("")
    (tmp_path / "x.csv").write_text("a,b\n")
    bad = _jsonl(tmp_path / "bad.jsonl", ["fine"])
    bad.write_text(bad.read_text() + "{not json\n")
    nofield = _jsonl(tmp_path / "nofield.jsonl", ["fine"], field="body")
    cases = {
        str(tmp_path / "missing"): "missing: no such file or directory; expected existing",
        str(tmp_path / "empty"): "the directory holds no .txt, .text, .jsonl, .parquet file",
        str(tmp_path / "x.csv"): "a .csv file is not a format multigpu reads",
        str(tmp_path / "*.tsv"): "the pattern matches no .txt",
        str(tmp_path / "e.jsonl"): "all 1 file(s) are empty",
    }
    for path, said in cases.items():
        with pytest.raises(UsageError, match=said.replace("(", r"\(").replace(")", r"\)")):
            check_sources([path])
    with pytest.raises(UsageError, match="--tokenizer ./nowhere: no such directory"):
        check_sources([str(nofield)], tokenizer="./nowhere")
    assert list_sources([str(tmp_path / "*.jsonl")]) == [bad, tmp_path / "e.jsonl", nofield]
    with pytest.raises(DataError, match=r"bad.jsonl: line 2 is not JSON"):
        build_token_file([bad], cache_dir=tmp_path / "c")
    with pytest.raises(DataError, match=r"nofield.jsonl: line 1 has no string field 'text'"):
        build_token_file([nofield], cache_dir=tmp_path / "c")
    assert not any((tmp_path / "c").iterdir())  # a failed build leaves nothing behind


def test_a_text_file_is_copied_in_chunks_as_one_document(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(token_file, "_CHUNK", 3)  # a file larger than a chunk, as a huge one is
    (tmp_path / "a.txt").write_text("0123456789")
    (tmp_path / "b.txt").write_text("")  # empty: no document
    _jsonl(tmp_path / "c.jsonl", ["xy"])
    (tmp_path / "d.txt").write_text("abcd")
    built = build_token_file([tmp_path / "a.txt", tmp_path], cache_dir=tmp_path / "cache")
    tokens = TokenFile(built)
    assert bytes(tokens.tokens.tolist()) == b"0123456789xyabcd"
    assert tokens.starts.tolist() == [0, 10, 12]
    # pickled as its path (a loader worker that spawns), not its tokens
    again = pickle.loads(pickle.dumps(PackedSequences(tokens, 4)))
    assert len(pickle.dumps(tokens)) < 300 and again[1][0].tolist() == list(b"4567")

"""``multigpu train --model lm --data PATHS``: your files, tokenized once, trained and resumed."""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from multigpu.errors import UsageError
from multigpu.examples.lm import build_model, train
from multigpu.examples.lm_options import build_parser
from multigpu.launch.train import parse_job_args
from multigpu.testing import run_distributed
from tests.launch._util import run_multigpu

TINY = [
    "--n-layer", "1", "--n-head", "2", "--n-embd", "64", "--block-size", "32", "--lr", "1e-2",
    "--batch-size", "16", "--eval-windows", "32", "--progress", "off",
]  # fmt: skip

WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "a",
    "mat",
    "while",
    "a",
    "dog",
    "ran",
    "far",
    "away",
    "from",
    "home",
    "and",
    "then",
    "came",
    "back",
]


def _folder(root: Path, shards: int = 3, docs: int = 120) -> Path:
    """A folder of JSON-lines shards of short made-up documents (the same for the same root)."""
    rng = random.Random(0)
    folder = root / "corpus"
    folder.mkdir()
    for s in range(shards):
        lines = []
        for i in range(docs):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40))) + "."
            lines.append(json.dumps({"id": f"{s}-{i}", "text": text}))
        (folder / f"shard-{s:02d}.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def _train(argv: list[str]) -> dict[str, Any]:
    return train(build_parser().parse_args(argv))


def test_one_and_two_processes_train_the_same_on_files_below_the_unigram_baseline(
    tmp_path: Path,
):
    data = ["--data", str(_folder(tmp_path)), "--data-cache", str(tmp_path / "cache")]
    argv = [*TINY, *data, "--steps", "16", "--eval-every", "8"]
    alone = run_distributed(_train, world_size=1, args=(argv,))[0]
    r0, _ = run_distributed(_train, world_size=2, args=(argv,))
    assert r0["world_size"] == 2 and r0["corpus"]["documents"] == 360
    assert r0["corpus"]["tokenizer"] == "bytes" and r0["corpus"]["files"] == 3
    assert r0["val_loss"] < 0.8 * r0["unigram_baseline"], r0["history"]
    # the same global batches, the loss weighted by real tokens: the same run to float error
    for one, two in zip(alone["history"], r0["history"], strict=True):
        assert one["val_loss"] == pytest.approx(two["val_loss"], abs=2e-4)
        assert one["train_loss"] == pytest.approx(two["train_loss"], abs=2e-4)
    assert len(list((tmp_path / "cache").iterdir())) == 1  # tokenized once, found after


def test_a_run_stopped_on_two_processes_resumes_on_one_to_the_uninterrupted_result(
    tmp_path: Path,
):
    data = ["--data", str(_folder(tmp_path)), "--data-cache", str(tmp_path / "cache")]
    argv = [*TINY, *data, "--steps", "16", "--eval-every", "16", "--checkpoint-every", "8"]
    argv += ["--out", str(tmp_path / "run")]
    whole = run_distributed(_train, world_size=2, args=(argv,))[0]
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step-00000016")  # died after step 8
    again = run_distributed(_train, world_size=1, args=(argv,))[0]
    assert again["resumed_from_step"] == 8 and again["world_size"] == 1
    # the loader's global cursor and the token-weighted loss: the same steps, to float error
    assert again["val_loss"] == pytest.approx(whole["val_loss"], abs=2e-4)
    assert [r["step"] for r in again["history"]] == [16]  # its train loss: steps 9-16 only


def _params(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


def test_multigpu_train_on_a_folder_of_jsonl_reports_tokens_per_second_and_resumes_exactly(
    tmp_path: Path,
):
    folder = _folder(tmp_path)
    out = tmp_path / "run"
    argv = ["train", "--model", "lm", "--cpu", "2", *TINY, "--progress", "lines"]
    argv += ["--data", str(folder), "--data-cache", str(tmp_path / "cache")]
    argv += ["--steps", "20", "--eval-every", "10", "--checkpoint-every", "10", "--out", str(out)]
    done = run_multigpu(argv, tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = next(ln for ln in lines if ln.startswith("lm: ") and "corpus" in ln)
    assert "tokens of 360 documents in 3 file(s), tokenizer bytes" in header, header
    steps = [ln for ln in lines if ln.startswith("step ")]
    assert [ln.split()[1] for ln in steps] == ["10/20", "20/20"]
    assert all(re.search(r"  \d+ tokens/s  ", ln) for ln in steps), steps
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["tokens_per_second"] > 0 and metrics["val_loss"] < metrics["unigram_baseline"]
    for record in metrics["history"]:  # 10 steps of 16 x 32 tokens each
        assert record["tokens_per_second"] == pytest.approx(16 * 32 / record["step_seconds"], 0.01)
    uninterrupted = _params(out / "model.pt")
    # as if it had died after step 10: the same command resumes there, to the same model
    shutil.rmtree(out / "checkpoints" / "step-00000020")
    (out / "model.pt").unlink()
    again = run_multigpu(argv, tmp_path)
    assert again.returncode == 0, again.stderr
    resumed = json.loads((out / "metrics.json").read_text())
    assert resumed["resumed_from_step"] == 10 and resumed["val_loss"] == metrics["val_loss"]
    assert [r["step"] for r in resumed["history"]] == [20]
    model = build_model(n_layer=1, n_head=2, n_embd=64, block_size=32)
    model.load_state_dict(_params(out / "model.pt"))
    for name, tensor in _params(out / "model.pt").items():
        assert torch.equal(tensor, uninterrupted[name]), name


def test_bad_data_is_one_line_and_exit_2_before_or_after_workers_start(tmp_path: Path):
    folder = _folder(tmp_path, shards=1, docs=5)
    cache = ["--data-cache", str(tmp_path / "cache")]
    base = ["train", "--model", "lm", "--cpu", "2", *TINY, "--steps", "2"]
    (tmp_path / "empty").mkdir()
    launcher = {  # refused by the launcher: no worker starts
        str(tmp_path / "nowhere"): f"--data {tmp_path / 'nowhere'}: no such file or directory",
        str(tmp_path / "empty"): f"--data {tmp_path / 'empty'}: the directory holds no .txt",
    }
    for path, said in launcher.items():
        done = run_multigpu([*base, "--data", path, *cache], tmp_path, timeout=60)
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and said in done.stderr, done.stderr
        assert "multigpu: writing to" not in done.stdout  # nothing started
    # too little text for the options: every rank refuses the same line, after tokenizing
    done = run_multigpu([*base, "--data", str(folder), *cache], tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert re.search(r"--data gives \d+ training and \d+ validation windows", last), last
    assert "give more text or lower --block-size / --batch-size" in last
    # a record that is not JSON: its file and line
    (folder / "shard-00.jsonl").write_text('{"text": "fine"}\n{oops\n')
    done = run_multigpu([*base, "--data", str(folder), *cache], tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "shard-00.jsonl: line 2 is not JSON" in done.stderr.strip().splitlines()[-1]


def test_a_hugging_face_tokenizer_sets_the_vocabulary_and_ends_documents_with_eos(tmp_path: Path):
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    vocab = {w: i for i, w in enumerate(["[UNK]", "</s>", ".", *dict.fromkeys(WORDS)])}
    raw = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=raw, unk_token="[UNK]", eos_token="</s>"
    ).save_pretrained(tmp_path / "tok")
    folder = _folder(tmp_path)
    data = ["--data", str(folder), "--data-cache", str(tmp_path / "cache")]
    argv = [*TINY, *data, "--tokenizer", str(tmp_path / "tok"), "--block-size", "16"]
    r0, _ = run_distributed(_train, world_size=2, args=([*argv, "--steps", "4"],))
    corpus = r0["corpus"]
    assert corpus["vocab_size"] == len(vocab) == 20 and corpus["documents"] == 360
    assert corpus["tokenizer"] == str(tmp_path / "tok")
    shape = {"n_layer": 1, "n_head": 2, "n_embd": 64, "block_size": 16}
    whole = sum(p.numel() for p in build_model(vocab_size=20, **shape).parameters())
    assert r0["n_params"] == whole  # embedding and head of the tokenizer's vocabulary
    # a token per word, one for the "." and an EOS per document
    texts = [json.loads(ln)["text"] for f in folder.iterdir() for ln in f.read_text().splitlines()]
    expected = sum(len(t.split(" ")) + 2 for t in texts)
    assert corpus["train_tokens"] + corpus["val_tokens"] == expected
    # random words: nothing to learn beyond their frequencies in 4 steps, but it trains
    assert 0 < r0["val_loss"] < 2 * r0["unigram_baseline"] and r0["tokens_per_second"] > 0


def test_the_launcher_refuses_data_options_without_data_and_checks_data_paths(tmp_path: Path):
    for option in (["--tokenizer", "gpt2"], ["--text-field", "body"], ["--data-cache", "c"]):
        with pytest.raises(UsageError, match=f"{option[0]} {option[1]} was given without --data"):
            parse_job_args("lm", option)
    folder = _folder(tmp_path, shards=1, docs=2)
    assert parse_job_args("lm", ["--data", str(folder)]).data == [str(folder)]
    (folder / "x.csv").write_text("a,b\n")
    with pytest.raises(UsageError, match=r"x\.csv: a \.csv file is not a format multigpu reads"):
        parse_job_args("lm", ["--data", str(folder / "x.csv"), str(folder)])

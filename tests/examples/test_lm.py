"""``multigpu train --model lm``: the corpus, the model, and real training on two processes."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from multigpu.errors import UsageError
from multigpu.examples import lm_data
from multigpu.examples.lm import Block, build_model, train
from multigpu.examples.lm_options import build_parser, warmup_cosine
from multigpu.testing import run_distributed
from tests.launch._util import child_env, run_multigpu

# A model and corpus small enough for a few seconds of training on two CPU processes.
TINY = [
    "--n-layer", "1", "--n-head", "2", "--n-embd", "64", "--block-size", "32", "--lr", "1e-2",
    "--batch-size", "16", "--corpus-mb", "0.3", "--eval-windows", "64", "--progress", "off",
]  # fmt: skip


SHAPE = {"n_layer": 1, "n_head": 2, "n_embd": 64, "block_size": 32}


# ---- the corpus ---------------------------------------------------------------------------------
def _tree(root: Path) -> None:
    for name, text in {
        "b.py": b"bbbb",
        "a.py": b"aaaa",
        "pkg/c.py": b"cccc",
        "pkg/__pycache__/c.py": b"XXXX",
        "site-packages/d.py": b"XXXX",
        "notes.txt": b"XXXX",
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(text)


def test_corpus_is_the_sources_in_walk_order_cut_to_size_with_the_tail_for_validation(
    tmp_path: Path,
):
    _tree(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in lm_data.stdlib_sources(tmp_path)] == [
        "a.py",
        "b.py",
        "pkg/c.py",
    ]
    corpus = lm_data.load_corpus(10, val_fraction=0.2, root=tmp_path)
    assert bytes(corpus.train.tolist()) == b"aaaabbbb" and bytes(corpus.val.tolist()) == b"cc"
    assert corpus.files == 3
    with pytest.raises(UsageError, match="13 bytes was asked for, but the sources hold 12"):
        lm_data.load_corpus(13, root=tmp_path)


def test_stdlib_corpus_is_deterministic_and_split_90_10():
    one, two = lm_data.load_corpus(200_000), lm_data.load_corpus(200_000)
    assert one.sha256 == two.sha256 and torch.equal(one.val, two.val)
    assert (len(one.train), len(one.val)) == (180_000, 20_000)
    assert b"import" in bytes(one.train[:20_000].tolist())  # Python source, as bytes


def test_unigram_baseline_is_the_cross_entropy_of_smoothed_train_frequencies():
    train_bytes = torch.tensor(list(b"aab"), dtype=torch.uint8)
    val_bytes = torch.tensor(list(b"ab"), dtype=torch.uint8)
    # counts + 1: a -> 3, b -> 2, the 254 others -> 1; 259 in all
    expected = -(math.log(3 / 259) + math.log(2 / 259)) / 2
    assert lm_data.unigram_baseline(train_bytes, val_bytes) == pytest.approx(expected, rel=1e-12)
    # The same number as a model that predicts those frequencies whatever the context.
    corpus = lm_data.load_corpus(100_000)
    counts = torch.bincount(corpus.train.long(), minlength=256).double() + 1
    logits = counts.log().expand(len(corpus.val), 256)
    as_model = F.cross_entropy(logits, corpus.val.long()).item()
    assert lm_data.unigram_baseline(corpus.train, corpus.val) == pytest.approx(as_model)


def test_windows_are_shifted_by_one_and_evaluation_windows_divide_among_ranks():
    data = torch.arange(101, dtype=torch.uint8)
    windows = lm_data.Windows(data, 10)
    assert len(windows) == 10
    x, y = windows[9]
    assert x.tolist() == list(range(90, 100)) and y.tolist() == list(range(91, 101))
    spread = lm_data.evenly_spaced(data, 10, count=7, multiple_of=3)
    assert spread.indices == [0, 1, 3, 5, 6, 8]  # 6 of 10 windows, spread evenly
    assert len(lm_data.evenly_spaced(data, 10, count=50, multiple_of=4)) == 8
    with pytest.raises(ValueError, match="cannot make a window"):
        lm_data.Windows(data, 101)


# ---- the model ----------------------------------------------------------------------------------
def test_model_builds_on_meta_and_materializes_by_reset_parameters():
    with torch.device("meta"):
        model = build_model()
    expected = 256 * 128 + 64 * 128 + 4 * (12 * 128 * 128 + 13 * 128) + 2 * 128 + 128 * 256
    assert sum(p.numel() for p in model.parameters()) == expected
    model.to_empty(device="cpu")
    for module in model.modules():
        owns = any(True for _ in module.parameters(recurse=False)) or any(
            True for _ in module.buffers(recurse=False)
        )
        if owns:
            module.reset_parameters()  # every owner has one (AttributeError otherwise)
    logits = model(torch.randint(0, 256, (2, 64)))
    assert logits.shape == (2, 64, 256) and torch.isfinite(logits).all()
    assert [type(b) for b in model.blocks] == [Block] * 4


def test_model_is_causal_and_checks_its_heads():
    torch.manual_seed(0)
    model = build_model(n_layer=2, n_embd=32, n_head=4, block_size=16).eval()
    idx = torch.randint(0, 256, (1, 16))
    changed = idx.clone()
    changed[0, 10] = (idx[0, 10] + 1) % 256
    a, b = model(idx), model(changed)
    assert torch.equal(a[0, :10], b[0, :10])  # no position sees a later byte
    assert not torch.allclose(a[0, 10:], b[0, 10:])
    with pytest.raises(UsageError, match="n_embd=30 is not divisible by n_head=4"):
        build_model(n_embd=30)


def test_schedule_warms_up_then_decays_to_a_tenth():
    f = warmup_cosine(build_parser().parse_args(["--steps", "200"]))
    assert [f(s) for s in (0, 9)] == [0.1, 1.0]
    assert f(105) == pytest.approx(0.55) and f(200) == pytest.approx(0.1)


# ---- training on real processes -----------------------------------------------------------------
def _train(argv: list[str]) -> dict[str, Any]:
    return train(build_parser().parse_args(argv))


def test_two_processes_learn_below_the_unigram_baseline_and_match_one_process():
    argv = [*TINY, "--steps", "60", "--eval-every", "30"]
    alone = run_distributed(_train, world_size=1, args=(argv,))[0]
    r0, r1 = run_distributed(_train, world_size=2, args=(argv,))
    for record in (*r0["history"], *r1["history"]):
        for key in ("tokens_per_second", "step_seconds", "collective_wait_share"):
            record.pop(key)  # each rank's own clock
        record.pop("peak_memory_bytes")  # the largest over the ranks, but read at different times
    assert r0["history"] == r1["history"]  # every rank reports the all-reduced numbers
    assert r0["world_size"] == 2 and r0["strategy"] == "ddp"
    assert r0["val_loss"] < 0.85 * r0["unigram_baseline"], r0["history"]
    # Same global batches in the same order, gradients averaged: the same run, to float error.
    for one, two in zip(alone["history"], r0["history"], strict=True):
        assert one["val_loss"] == pytest.approx(two["val_loss"], abs=2e-4)
        assert one["train_loss"] == pytest.approx(two["train_loss"], abs=2e-4)


def test_fsdp_trains_as_ddp_writes_a_whole_model_and_resumes_where_it_left_off(tmp_path: Path):
    argv = [*TINY, "--steps", "12", "--eval-every", "12"]
    ddp = run_distributed(_train, world_size=2, args=(argv,))[0]
    sharded = [*argv, "--strategy", "fsdp", "--checkpoint-every", "6", "--out", str(tmp_path)]
    whole = run_distributed(_train, world_size=2, args=(sharded,))[0]
    assert whole["strategy"] == "fsdp" and whole["resumed_from_step"] is None
    assert whole["val_loss"] == pytest.approx(ddp["val_loss"], abs=2e-4)
    assert whole["train_loss"] == pytest.approx(ddp["train_loss"], abs=2e-4)
    model = build_model(n_layer=1, n_head=2, n_embd=64, block_size=32)
    model.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))  # gathered
    shutil.rmtree(tmp_path / "checkpoints" / "step-00000012")  # as if it died after step 6
    again = run_distributed(_train, world_size=2, args=(sharded,))[0]
    assert again["resumed_from_step"] == 6
    assert again["val_loss"] == whole["val_loss"] and again["train_loss"] is not None


def test_pipeline_counts_the_whole_model_and_its_sends_as_waiting():
    argv = [*TINY, "--n-layer", "2", "--steps", "4", "--eval-every", "2", "--strategy", "pipeline"]
    r0, r1 = run_distributed(_train, world_size=2, args=(argv,))
    whole = sum(p.numel() for p in build_model(**{**SHAPE, "n_layer": 2}).parameters())
    assert r0["n_params"] == r1["n_params"] == whole  # not the stage rank 0 holds
    for record in r0["history"]:  # each stage waits on the other's activations and gradients
        assert record["tokens_per_second"] > 0 and 0 < record["collective_wait_share"] < 1


# ---- the command --------------------------------------------------------------------------------
def test_multigpu_train_model_lm_on_two_processes(tmp_path: Path):
    out = tmp_path / "run"
    argv = ["train", "--model", "lm", "--cpu", "2", *TINY, "--progress", "lines"]
    every = ["--checkpoint-every", "15"]  # step 15, and the last step (20)
    argv += ["--steps", "20", "--eval-every", "10", "--out", str(out), "--profile", "3:4", *every]
    done = run_multigpu(argv, tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    steps = [ln for ln in lines if ln.startswith("step ")]
    assert [ln.split()[1] for ln in steps] == ["10/20", "20/20"]  # rank 0 only
    assert all("val loss" in ln and "unigram" in ln and "tokens/s" in ln for ln in steps)
    # the throughput of the steps since the last line: step time, wait share, peak memory
    assert all(re.search(r"step \d+\.\d ms  wait \d+%  peak \d+ MiB$", ln) for ln in steps), steps
    assert lines[-3].startswith("val loss ") and "vs unigram baseline" in lines[-3]
    png = ", loss.png" if (out / "loss.png").exists() else ""  # with matplotlib (extra plot)
    assert lines[-2] == f"wrote {out}/: model.pt, metrics.json{png}"
    newest = out / "checkpoints" / "step-00000020"
    assert lines[-1] == (
        f"checkpoints in {out}/checkpoints/: step-00000015, step-00000020 (multigpu ckpt "
        f"inspect {newest})"
    )
    assert (newest / "COMMITTED").is_file()
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["strategy"] == "ddp"
    assert [r["step"] for r in metrics["history"]] == [10, 20]
    assert metrics["tokens_per_second"] > 0 and metrics["val_loss"] < metrics["unigram_baseline"]
    for record in metrics["history"]:  # 10 steps of 16 x 32 tokens each
        assert record["tokens_per_second"] == pytest.approx(16 * 32 / record["step_seconds"], 0.01)
        assert 0 < record["collective_wait_share"] <= record["collective_wait_share_max"] < 1
        assert record["peak_memory_bytes"] > 50 * 2**20 and record["mfu"] is None  # CPU
    assert metrics["n_params"] == sum(p.numel() for p in build_model(**SHAPE).parameters())
    model = build_model(**SHAPE)
    model.load_state_dict(torch.load(out / "model.pt", weights_only=True))  # plain, CPU
    assert {p.name for p in out.iterdir()} - {"loss.png"} == {
        "checkpoints", "metrics.json", "model.pt", "profile"
    }  # fmt: skip
    # --profile 3:4: one Chrome trace per rank, with DDP's gradient all-reduce in it
    said = [ln for ln in lines if ln.startswith("profile: ")]
    assert said == [
        f"profile: optimizer steps 3-4 traced to {out / 'profile'}/rank<r>.json (Chrome trace, "
        "r = 0..1; open in https://ui.perfetto.dev or chrome://tracing)"
    ]
    assert sorted(p.name for p in (out / "profile").iterdir()) == ["rank0.json", "rank1.json"]
    for rank in (0, 1):
        events = json.loads((out / "profile" / f"rank{rank}.json").read_text())["traceEvents"]
        names = {e.get("name") for e in events}
        assert {"gloo:all_reduce", "c10d::allreduce_", "Optimizer.step#AdamW.step"} <= names
    assert "USDT" not in done.stderr  # kineto's start/stop lines are silenced


def test_a_corpus_too_small_for_the_options_is_one_line_and_exit_2(tmp_path: Path):
    done = subprocess.run(
        [sys.executable, "-m", "multigpu.examples.lm", "--corpus-mb", "0.001", "--steps", "1"],
        cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "multigpu train: error: --corpus-mb 0.001 gives 14 training and 1 validation windows of "
        "--block-size 64; expected at least one --batch-size (32) and one per process (1): "
        "raise --corpus-mb or lower --block-size / --batch-size"
    ]

"""``multigpu train --model lm --compile`` and ``--activation-checkpointing POLICY``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multigpu.errors import UsageError
from multigpu.examples.lm_parser import build_parser, check_checkpointing
from tests.examples.test_lm import TINY
from tests.launch._util import run_multigpu


def test_the_policy_option_takes_full_selective_or_a_budget_and_the_bare_flag_is_full():
    parse = build_parser().parse_args
    assert parse([]).activation_checkpointing is None and parse([]).compile is None
    assert parse(["--activation-checkpointing"]).activation_checkpointing == "full"
    assert parse(["--activation-checkpointing", "selective"]).activation_checkpointing == (
        "selective"
    )
    assert parse(["--activation-checkpointing", "0.5"]).activation_checkpointing == 0.5
    assert parse(["--compile"]).compile == "inductor"
    assert parse(["--compile", "aot_eager", "--steps", "3"]).compile == "aot_eager"
    with pytest.raises(UsageError, match=r"'1\.5' is not full, selective or a memory budget"):
        parse(["--activation-checkpointing", "1.5"])


def test_a_budget_needs_compile_and_a_policy_needs_ddp_or_fsdp():
    parse = build_parser().parse_args
    budget = parse(["--strategy", "fsdp", "--activation-checkpointing", "0.5"])
    with pytest.raises(UsageError, match=r"^--activation-checkpointing 0.5 is a memory budget"):
        check_checkpointing(budget, {})
    check_checkpointing(budget, {"MULTIGPU_COMPILE": "1"})  # compiled by the variable
    check_checkpointing(
        parse([*["--strategy", "ddp", "--compile"], "--activation-checkpointing", "0.5"]), {}
    )
    with pytest.raises(UsageError, match=r"^--activation-checkpointing with --strategy auto: "):
        check_checkpointing(parse(["--activation-checkpointing"]), {})


def test_a_budget_without_compile_is_refused_by_the_launcher(tmp_path: Path):
    argv = ["train", "--model", "lm", "--cpu", "2", "--strategy", "ddp"]
    done = run_multigpu([*argv, "--activation-checkpointing", "0.5"], tmp_path)
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "--activation-checkpointing 0.5 is a memory budget, which only torch.compile's "
            "partitioner applies; add --compile, or use --activation-checkpointing selective or "
            "full"
        )
    )
    assert not (tmp_path / "runs").exists()


def test_multigpu_train_lm_compiled_with_selective_checkpointing_under_fsdp(tmp_path: Path):
    out = tmp_path / "run"
    argv = ["train", "--model", "lm", "--cpu", "2", *TINY, "--steps", "4", "--out", str(out)]
    argv += ["--strategy", "fsdp", "--compile", "aot_eager", "--activation-checkpointing"]
    done = run_multigpu([*argv, "selective"], tmp_path, timeout=180)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    compiled = [ln for ln in lines if ln.startswith("torch.compile: compiled ")]
    assert len(compiled) == 1, lines  # rank 0, once
    assert compiled[0].startswith("torch.compile: compiled 1 block in ")
    assert compiled[0].endswith(" s (Block; backend aot_eager)")
    assert lines.count("torch.compile: no graph breaks") == 1
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["strategy"] == "fsdp" and metrics["val_loss"] > 0

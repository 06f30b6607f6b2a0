"""``multigpu train`` picks its job by ``--model`` and refuses, before it starts, a global batch
the processes cannot share, any argument the job's own parser refuses, and outputs it could not
write."""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import shlex
from pathlib import Path

import pytest

from multigpu.cli.main import main
from multigpu.errors import UsageError
from multigpu.examples import digits_parser, job_cli, lm_options, lm_parser
from multigpu.examples.digits import build_parser
from multigpu.examples.job_cli import check_outputs, directory_problem
from multigpu.launch.train import (
    JOB_PARSERS,
    MODEL_SUMMARIES,
    TRAIN_MODULE,
    TRAIN_MODULES,
    check_batch_size,
    check_checkpoint_options,
    choose_model,
    parse_job_args,
    training_help,
)
from tests.cpu_time import cpu_seconds
from tests.launch._util import run_multigpu


def test_launcher_knows_each_jobs_module():
    assert TRAIN_MODULE == TRAIN_MODULES["digits"] == "multigpu.examples.digits"
    parsers = {"digits": build_parser, "lm": lm_options.build_parser}
    assert set(TRAIN_MODULES) == set(MODEL_SUMMARIES) == set(parsers)
    for module in TRAIN_MODULES.values():
        assert callable(importlib.import_module(module).main), module  # python -m runs it


def test_model_option_chooses_the_job_and_is_not_passed_on():
    assert choose_model(["--epochs", "2"]) == ("digits", ["--epochs", "2"])
    assert choose_model(["--model", "lm", "--steps", "5"]) == ("lm", ["--steps", "5"])
    assert choose_model(["--model=digits", "--model=lm"]) == ("lm", [])  # the last one wins
    with pytest.raises(UsageError, match=r"--model gpt is not a built-in job; expected .*, lm"):
        choose_model(["--model", "gpt"])
    with pytest.raises(UsageError, match="--model without a name is not a built-in job"):
        choose_model(["--steps", "5", "--model"])


def test_dry_run_launches_the_chosen_module(capsys: pytest.CaptureFixture[str]):
    argv = ["train", "--model", "lm", "--cpu", "2", "--dry-run", "--steps", "5", "--out", "o"]
    assert main(argv) == 0
    plan = dict(ln.split(":", 1) for ln in capsys.readouterr().out.splitlines() if ":" in ln)
    assert shlex.split(plan["torchrun"])[-5:] == [
        "multigpu.examples.lm", "--steps", "5", "--out", "o"
    ]  # fmt: skip


def test_batch_size_is_checked_against_the_chosen_jobs_default(capsys: pytest.CaptureFixture[str]):
    check_batch_size([], 64)  # digits: 64 per step
    with pytest.raises(UsageError, match="--batch-size 32 .* 64 processes"):
        check_batch_size([], 64, "lm")
    assert main(["train", "--model", "lm", "--cpu", "3", "--dry-run"]) == 2
    assert "--batch-size 32 is not divisible by the 3 processes" in capsys.readouterr().err


def test_help_lists_the_models_and_the_chosen_jobs_options():
    text = training_help("lm")
    assert "--model {digits,lm}" in text and "the options of --model lm" in text
    assert "--n-layer" in text and "--epochs" not in text


@pytest.mark.parametrize(
    ("args", "processes"),
    [(["--batch-size", "64"], 2), (["--batch-size=63"], 3), ([], 4), (["--batch-size", "x"], 3)],
)
def test_divisible_or_left_to_the_job_parser(args, processes):
    check_batch_size(args, processes)


def test_not_divisible_names_the_numbers_and_the_fix():
    with pytest.raises(UsageError, match=r"--batch-size 63 .* 2 processes .* e\.g\. 62 or 64"):
        check_batch_size(["--epochs", "1", "--batch-size", "63"], 2)
    with pytest.raises(UsageError, match="--batch-size 64 .* 3 processes"):
        check_batch_size([], 3)


def test_checkpoint_options_are_checked_before_anything_starts(tmp_path):
    check_checkpoint_options(["--out", str(tmp_path), "--checkpoint-every", "5"])
    check_checkpoint_options(["--resume", "never"])  # no checkpointing: nothing to refuse
    with pytest.raises(UsageError, match="--checkpoint-every was given without a place"):
        check_checkpoint_options(["--checkpoint-every", "5"])
    with pytest.raises(UsageError, match="--resume x needs checkpointing"):
        check_checkpoint_options(["--resume", "x"])
    with pytest.raises(UsageError, match="no such checkpoint directory"):
        check_checkpoint_options(["--out", str(tmp_path), "--checkpoint-every=2", "--resume=/no"])
    (tmp_path / "checkpoints" / "step-00000004").mkdir(parents=True)
    with pytest.raises(UsageError, match="already holds step-00000004"):
        check_checkpoint_options(
            ["--out", str(tmp_path), "--checkpoint-every", "2", "--resume", "never"]
        )


def test_bad_checkpoint_options_exit_2_with_one_line_and_write_nothing(tmp_path):
    # Without --out the launcher would write to runs/digits/1: refused, it creates nothing.
    done = run_multigpu(["train", "--resume", "nowhere", "--epochs", "1"], tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "multigpu: error: --resume nowhere: no such checkpoint directory; expected auto, never "
        "or the path of a step-XXXXXXXX directory"
    ]
    assert list(tmp_path.iterdir()) == []


def test_fsdp_with_ddp_compression_is_refused_before_any_worker_starts(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code = main(
        ["train", "--cpu", "2", "--strategy", "fsdp", "--compression", "bf16", "--out", str(out)]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "--compression bf16 compresses DDP's gradient all-reduce" in err[0]
    assert "--strategy fsdp does not have" in err[0]
    assert not out.exists()  # nothing written, nothing started


BAD_JOB_ARGS = {
    "epochs-zero": (["--epochs", "0"], "argument --epochs: 0 must be a positive finite number"),
    "batch-negative": (["--batch-size", "-1"], "argument --batch-size: -1 must be a positive"),
    "lr-nan": (["--lr", "nan"], "argument --lr: nan must be a positive finite number"),
    "accumulation-zero": (["--accumulation-steps", "0"], "--accumulation-steps: 0 must be"),
    "strategy-bogus": (["--strategy", "bogus"], "argument --strategy: invalid choice: 'bogus'"),
    "strategy-fsdpp": (["--strategy", "fsdpp"], "'fsdp', 'pipeline'); did you mean fsdp?"),
    "precision-8": (["--precision", "8"], "argument --precision: invalid choice: '8'"),
    "checkpoint-every-zero": (["--checkpoint-every", "0"], "--checkpoint-every: 0 must be"),
    "keep-negative": (["--keep-checkpoints", "-1"], "--keep-checkpoints: -1 must be"),
    "unknown-flag": (["--bogus"], "unrecognized arguments: --bogus"),
    "abbreviation": (["--epoch", "2"], "unrecognized arguments: --epoch 2"),
    "lm-abbreviation": (["--model", "lm", "--step", "2"], "unrecognized arguments: --step 2"),
    "out-is-a-file": (["--out", "/etc/hostname"], "--out /etc/hostname: /etc/hostname is a file"),
}


@pytest.mark.parametrize("name", list(BAD_JOB_ARGS))
def test_a_bad_training_option_is_one_line_exit_2_before_any_worker_starts(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: every worker started, and each printed the job's usage block (14-25 lines) or
    # a traceback; --epoch 2 trained. Here the launcher refuses it itself, in milliseconds
    # (the imports are done), and writes nothing.
    args, expected = BAD_JOB_ARGS[name]
    monkeypatch.chdir(tmp_path)
    started = cpu_seconds()  # CPU, not wall time: the claim is no worker, not a fast machine
    code = main(["train", "--cpu", "2", *args])
    seconds = cpu_seconds() - started
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("multigpu: error: ") and expected in err[0], err[0]
    assert err[0].endswith("--help'") or "give another --out" in err[0]
    assert seconds < 3, seconds
    assert list(tmp_path.iterdir()) == []


def test_every_job_parser_takes_whole_option_names_only():
    for model, build in JOB_PARSERS.items():
        parser = build()
        assert parser.allow_abbrev is False, model
        with pytest.raises(UsageError, match="unrecognized arguments: --batch 8"):
            parser.parse_args(["--batch", "8"])
    assert JOB_PARSERS["lm"] is lm_options.build_parser  # the job parses with the same parser
    assert build_parser is digits_parser.build_parser


def test_the_job_parsers_import_no_torch():
    # The launcher imports them (parse_job_args): argparse and multigpu's light modules only.
    allowed = {"__future__", "argparse", "math", "os", "sys", "tempfile", "collections"}
    allowed |= {"pathlib", "typing", "multigpu"}
    light = {"multigpu.errors", "multigpu.examples.job_cli"}
    light |= {f"multigpu.common.{name}" for name in ("choices", "variables", "arguments")}
    light |= {"multigpu.common.tracker_names", "multigpu.common.profile_window"}
    light |= {"multigpu.common.text_sources"}  # --data: the stdlib only (glob, os, pathlib)
    packages = {"multigpu.common"}  # from multigpu.common import variables
    for module in (digits_parser, lm_parser, job_cli):
        names = set()
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module in {"multigpu", *packages}:
                names |= {
                    f"{node.module}.{alias.name}" for alias in node.names
                }  # from multigpu.common import x
            elif isinstance(node, ast.ImportFrom):
                names.add(node.module or "")
        assert {n.split(".")[0] for n in names} <= allowed, (module.__name__, names)
        assert {n for n in names if n.startswith("multigpu")} <= light, names


def test_parse_job_args_gives_the_jobs_namespace():
    assert parse_job_args("digits", ["--epochs", "2", "--strategy=fsdp"]).strategy == "fsdp"
    assert parse_job_args("lm", []).batch_size == lm_parser.DEFAULT_BATCH_SIZE


def test_outputs_must_be_writable_directories_and_nothing_is_left_behind(tmp_path: Path):
    (tmp_path / "file").write_text("x")
    assert directory_problem(tmp_path / "new" / "deeper") is None  # creatable: fine
    assert directory_problem(tmp_path) is None
    assert os.listdir(tmp_path) == ["file"]  # the write test left nothing, created nothing
    assert directory_problem(tmp_path / "file") == f"{tmp_path / 'file'} is a file, not a directory"
    assert "is a file" in str(directory_problem(tmp_path / "file" / "sub"))
    with pytest.raises(UsageError, match=r"--checkpoint-dir .*file/ckpt: .* is a file"):
        parse_job_args("lm", ["--checkpoint-dir", str(tmp_path / "file" / "ckpt")])
    with pytest.raises(UsageError, match=r"--save .* is a directory; expected the path of a file"):
        parse_job_args("digits", ["--save", str(tmp_path)])
    with pytest.raises(UsageError, match=r"--out .*checkpoints: .* is a file"):
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "checkpoints").write_text("x")
        parse_job_args("digits", ["--out", str(tmp_path / "out"), "--checkpoint-every", "2"])
    check_outputs(parse_job_args("digits", ["--out", str(tmp_path / "runs" / "a")]))
    assert not (tmp_path / "runs").exists()


def test_on_several_nodes_the_launcher_checks_only_the_checkpoint_directory(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Only the node hosting rank 0 writes --out and --save, and which node that is, the
    # rendezvous decides; every rank writes its part of a checkpoint.
    parse_job_args("digits", ["--out", "/etc/hostname"], single_node=False)
    with pytest.raises(UsageError, match="--checkpoint-dir /etc/hostname: .* is a file"):
        parse_job_args("lm", ["--checkpoint-dir", "/etc/hostname"], single_node=False)
    assert main(["train", "--nnodes", "1:1", "--out", "/etc/hostname"]) == 2  # one node
    assert "--out /etc/hostname: /etc/hostname is a file" in capsys.readouterr().err


def test_a_directory_nobody_may_write_in_is_refused_even_for_root():
    # /sys refuses new files even to root (os.access would say yes): a real write is tried.
    problem = directory_problem(Path("/sys/multigpu-out"))
    if problem is None:
        pytest.skip("/sys is writable here")
    assert problem.startswith("/sys is not writable (")


def test_ddp_compression_under_a_strategy_chosen_by_the_variable_is_refused_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: MULTIGPU_STRATEGY=fsdp with --compression bf16 trained DDP (bf16-compressed):
    # the job built a DDPStrategy for --compression and never read the variable.
    monkeypatch.setenv("MULTIGPU_STRATEGY", "fsdp")
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--cpu", "2", "--compression", "bf16"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "which MULTIGPU_STRATEGY=fsdp does not have" in err[0], err
    assert digits_parser.check_compression("ddp", "bf16", {"MULTIGPU_STRATEGY": "fsdp"}) == "ddp"
    assert list(tmp_path.iterdir()) == []

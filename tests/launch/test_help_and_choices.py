"""``run --help`` and ``train --help`` read top-down (multigpu's options first, one usage block),
and a mistyped choice is answered with the closest one. In-process: nothing starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from multigpu.cli.main import main
from multigpu.common import variables
from multigpu.common.arguments import Parser
from multigpu.common.choices import STRATEGY_NAMES, did_you_mean
from multigpu.errors import UsageError


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main([*argv, "--help"]) == 0
    return capsys.readouterr().out


def test_run_help_lists_multigpus_options_before_torchruns(capsys: pytest.CaptureFixture[str]):
    text = _help(capsys, "run")
    lines = text.splitlines()
    assert lines[0] == "usage: multigpu run [multigpu options] [torchrun options] script.py [args]"
    ours, theirs = lines.index("multigpu options:"), lines.index("torchrun options:")
    assert ours < theirs  # before: --gpus came after ~140 lines of torchrun's options
    assert ours < 30, ours
    section = "\n".join(lines[ours:theirs])
    for option in ("--gpus", "--cpu", "--backend", "--iface", "--timeout", "--dry-run"):
        assert f"  {option}" in section, option
    torchrun = "\n".join(lines[theirs:])
    for option in ("--nproc-per-node", "--rdzv-endpoint", "--max-restarts", "--standalone"):
        assert f"  {option}" in torchrun and f"  {option}" not in section, option


def test_train_help_has_one_usage_block_and_each_jobs_options(
    capsys: pytest.CaptureFixture[str],
):
    for model, option in (("digits", "--epochs"), ("lm", "--n-layer")):
        text = _help(capsys, "train", "--model", model)
        assert text.count("usage:") == 1, text  # before: the job's own usage block too
        lines = text.splitlines()
        job = f"training options (--model {model}):"
        headings = ("multigpu options:", "torchrun options:", job)
        order = [lines.index(heading) for heading in headings]
        assert order == sorted(order), order
        assert f"  {option}" in "\n".join(lines[order[2] :])
        assert "show this help message" not in text  # the job's -h is not offered twice


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["train", "--strategy", "fsdpp"], "invalid choice: 'fsdpp' (choose from 'auto', "),
        (["train", "--model", "lm", "--schedule", "1f1", "--cpu", "2"], "did you mean 1f1b?"),
        (["train", "--precision", "bf16"], "did you mean bf16-mixed?"),
        (["run", "--backend", "glo", "s.py"], "did you mean gloo?"),
        (["trian"], "did you mean train?"),
        (["ckpt", "inspct", "x"], "did you mean inspect?"),
        (["bench", "comn"], "did you mean comm?"),
    ],
)
def test_a_mistyped_choice_names_the_closest_one_in_one_line(
    argv: list[str],
    expected: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("multigpu: error: "), err
    assert expected in err[0], err[0]
    assert "did you mean" in err[0]
    assert list(tmp_path.iterdir()) == []  # nothing written for a refused command


def test_fsdpp_suggests_fsdp_and_nothing_when_nothing_is_close():
    assert did_you_mean("fsdpp", STRATEGY_NAMES) == "; did you mean fsdp?"
    assert did_you_mean("DDP", STRATEGY_NAMES) == "; did you mean ddp?"
    assert did_you_mean("zzz", STRATEGY_NAMES) == ""
    parser = Parser(prog="p")
    parser.add_argument("--n", type=int, choices=(1, 2, 4))
    with pytest.raises(UsageError, match=r"invalid choice: 3 \(choose from 1, 2, 4\)"):
        parser.parse_args(["--n", "3"])  # a near miss of a number is no suggestion


def test_a_multigpu_variable_with_choices_names_the_closest_one():
    with pytest.raises(UsageError) as refused:
        variables.strategy({"MULTIGPU_STRATEGY": "fsdpp"})
    message = str(refused.value)
    assert "MULTIGPU_STRATEGY='fsdpp' (from the environment) is not one of auto," in message
    assert "did you mean fsdp?" in message and message.endswith("MULTIGPU_STRATEGY=fsdp")
    with pytest.raises(UsageError, match=r"did you mean gloo\?"):
        variables.backend({"MULTIGPU_BACKEND": "gloooo"})

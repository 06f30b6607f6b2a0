"""``multigpu estimate`` as a user runs it: built-in models, a file's factory, JSON, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multigpu.launch.cli import main

BIG = """
import torch

def build():
    # 4.3 billion parameters: 80 GiB of training state per rank under DDP; built on meta
    return torch.nn.Sequential(*(torch.nn.Linear(16384, 16384) for _ in range(16)))
"""


def test_a_model_larger_than_the_machine_is_estimated_without_allocating_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "big.py").write_text(BIG)
    assert main(["estimate", f"{tmp_path / 'big.py'}:build", "--nproc", "8", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["parameters"] == 16 * (16384 * 16384 + 16384)
    ddp, fsdp = info["strategies"]["ddp"], info["strategies"]["fsdp"]
    assert ddp["total"] == 20 * info["parameters"]  # AdamW: params, grads, 2 states, buckets
    assert fsdp["params"] == -(-4 * info["parameters"] // 8)  # one eighth each
    assert info["fits"]["ddp"] is False and info["auto"] == "fsdp"
    assert info["largest_unit"] == 16384 * 16384 + 16384  # one Linear per unit


def test_builtin_models_print_a_table_and_the_choice(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "lm", "--nproc", "2", "--optimizer", "sgd-momentum"]) == 0
    out = capsys.readouterr().out
    assert "lm (GPT, 867,072 parameters" in out and "sgd-momentum" in out
    for row in ("ddp", "fsdp", "fsdp+offload"):
        assert f"│ {row} " in out
    assert "strategy='auto' chooses ddp" in out and "not included: activations" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["estimate", "nope"], "TARGET 'nope' is not a model"),
        (["estimate", "missing.py:build"], "missing.py does not exist"),
        (["estimate", "torch.nn:Linear"], "torch.nn:Linear() raised TypeError"),
        (["estimate", "torch:get_default_dtype"], "returned a dtype; expected an nn.Module"),
        (["estimate", "lm", "--nproc", "0"], "is not a number of processes"),
        (["estimate", "no_such_package_x:build"], "cannot import 'no_such_package_x'"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err

"""``multigpu estimate`` as a user runs it: built-in models, a file's factory, JSON, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from multigpu.cli.main import main
from tests.conftest import ROOT
from tests.gpus.recorded import h100
from tests.launch._util import child_env

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
    argv = ["estimate", f"{tmp_path / 'big.py'}:build", "--nproc", "8", "--cpu", "--json"]
    assert main(argv) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["parameters"] == 16 * (16384 * 16384 + 16384)
    ddp, fsdp = info["strategies"]["ddp"], info["strategies"]["fsdp"]
    # AdamW: params, grads, 2 states (no buckets: the gradients are views into them)
    assert ddp["total"] == 16 * info["parameters"]
    assert fsdp["params"] == -(-4 * info["parameters"] // 8)  # one eighth each
    assert info["fits"]["ddp"] is False and info["auto"] == "fsdp"
    assert info["largest_unit"] == 16384 * 16384 + 16384  # one Linear per unit


def test_builtin_models_print_a_table_and_the_choice(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", "lm", "--nproc", "2", "--cpu", "--optimizer", "sgd-momentum"]
    assert main(argv) == 0  # --cpu: the same on a machine with GPUs
    out = capsys.readouterr().out
    assert "lm (GPT, 867,072 parameters" in out and "sgd-momentum" in out
    for row in ("ddp", "fsdp", "fsdp+offload"):
        assert f"│ {row} " in out
    assert "strategy='auto' chooses ddp" in out and "not included: activations" in out


def test_gpus_found_are_the_capacity_and_the_step_temporaries_count(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import multigpu.gpus

    gpus = [h100(0, 2000), h100(1, 70000), h100(2, 60000)]
    monkeypatch.setattr(multigpu.gpus, "list_gpus", lambda: gpus)
    assert main(["estimate", "lm", "--nproc", "2", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["capacity"]["kind"] == "cuda" and info["capacity"]["bytes"] == 60000 * 2**20
    assert info["capacity"]["source"].startswith("GPU 2: NVIDIA H100")
    assert info["strategies"]["ddp"]["optimizer"] == 3 * 4 * info["parameters"]  # AdamW on a GPU
    assert info["fits"]["fsdp+offload"] is True and info["devices"] == "3 GPU(s), 2 used"
    assert main(["estimate", "lm"]) == 0  # default: every GPU
    assert "3 processes; 3 GPU(s), 3 used" in capsys.readouterr().out
    assert main(["estimate", "lm", "--nproc", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--nproc 4 but this machine has 3 GPU(s)" in err and "--cpu" in err, err
    assert main(["estimate", "lm", "--nproc", "4", "--cpu", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["capacity"]["kind"] == "cpu"


def test_nodes_multiply_the_processes_fsdp_shards_over(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "lm", "--nproc", "2", "--nnodes", "4", "--cpu", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["world_size"], info["nproc"], info["nnodes"]) == (8, 2, 4)
    keys = {"parameters", "strategies", "fits", "capacity", "choice", "auto", "auto_reason"}
    assert keys <= set(info) and info["choice"]["strategy"] == info["auto"] == "ddp"
    assert any("activations" in note for note in info["notes"])


BLOCKS = """
from torch import nn

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(512, 2048), nn.Linear(2048, 512)

class Net(nn.Module):  # three blocks, but as attributes: nothing says they are blocks
    def __init__(self):
        super().__init__()
        self.first, self.second, self.third = Block(), Block(), Block()

def build():
    return Net()
"""
GPT2 = Path(__file__).resolve().parents[1] / "strategies" / "scripts" / "gpt2_train.py"


def test_the_units_are_listed_and_one_holding_most_of_the_model_is_warned_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "blocks.py").write_text(BLOCKS)
    target = f"{tmp_path / 'blocks.py'}:build"
    argv = ["estimate", target, "--nproc", "2", "--cpu"]
    assert main([*argv, "--min-block-params", "10000000"]) == 0  # blocks of 2.1M: too small
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "FSDP units (children of 10,000,000+ parameters): <root> (6.30M) parameters"
    assert lines[2] == (
        "warning: FSDP unit <root> holds 100% of the model's 6,299,136 parameters: it is gathered "
        "whole, so sharding saves little; name blocks to shard one at a time: "
        "FSDPStrategy(blocks=(Block,)) (multigpu estimate --blocks Block)"
    )
    assert main([*argv, "--min-block-params", "10000000", "--blocks", "Block", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["fsdp_unit_rule"] == "given: Block" and info["fsdp_unit_warning"] is None
    assert [u["name"] for u in info["fsdp_units"]] == ["first", "second", "third", "<root>"]
    assert [u["parameters"] for u in info["fsdp_units"]] == [2_099_712] * 3 + [0]


@pytest.mark.requires("module:transformers")
def test_a_hugging_face_gpt2_is_listed_per_block_with_its_tied_head_in_the_root(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["estimate", f"{GPT2}:build", "--nproc", "2", "--cpu"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == (
        "FSDP units (declared: GPT2Block): transformer.h.0 (198.3k), transformer.h.1 (198.3k), "
        "<root> (132.4k) parameters"
    )
    assert not any(line.startswith("warning:") for line in out)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["estimate", "nope"], "TARGET 'nope' is not a model"),
        (["estimate", "missing.py:build"], "missing.py does not exist"),
        (["estimate", "torch.nn:Linear"], "torch.nn:Linear() raised TypeError"),
        (["estimate", "torch:get_default_dtype"], "returned a dtype; expected an nn.Module"),
        (["estimate", "lm", "--nproc", "0"], "is not a number of processes"),
        (["estimate", "no_such_package_x:build"], "cannot import 'no_such_package_x'"),
        (["estimate", "torch.nn:no_such_thing"], "torch.nn has no callable 'no_such_thing'"),
        (["estimate", "lm", "--nnodes", "0"], "'0' is not a number of processes"),
        (["estimate", "lm", "--optimizer", "lion"], "invalid choice: 'lion'"),
        (["estimate", "{dir}/raises.py:build"], "raises.py raised ZeroDivisionError"),
        (["estimate", "lm", "--blocks", "Blok"], "has no module of class Blok; expected"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "raises.py").write_text("1 / 0\n")
    argv = [a.replace("{dir}", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


BIG_SCRIPT = """
import torch
from torch.utils.data import TensorDataset
import multigpu

with multigpu.init(seed=0) as ctx:
    data = TensorDataset(torch.randn(100_000, 16384), torch.randn(100_000, 16384))  # 6 GiB
    model = torch.nn.Sequential(*(torch.nn.Linear(16384, 16384) for _ in range(16)))  # 4.3 B
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = ctx.setup(model, optimizer)
    raise SystemExit("the training loop is never reached")
"""


def _estimate(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "multigpu", "estimate", *argv],
        cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_the_readmes_script_is_estimated_with_its_own_model_and_optimizer(tmp_path: Path) -> None:
    done = _estimate(str(ROOT / "examples" / "minimal.py"), "--cpu", "--nproc", "2", "--json",
                     cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["model"] == "Sequential" and info["parameters"] == 32 * 64 + 64 + 64 * 4 + 4
    assert info["optimizer"] == "sgd"  # what it gives ctx.setup, not the default AdamW
    assert not list(tmp_path.iterdir())  # its `if ctx.is_main: torch.save(...)` never ran
    given = _estimate(str(ROOT / "examples" / "minimal.py"), "--cpu", "--optimizer", "adamw",
                      "--json", cwd=tmp_path)  # fmt: skip
    assert json.loads(given.stdout)["optimizer"] == "adamw", given.stderr  # --optimizer wins


def test_a_script_larger_than_the_machine_is_estimated_on_the_meta_device(tmp_path: Path) -> None:
    (tmp_path / "big_train.py").write_text(BIG_SCRIPT)
    done = _estimate("big_train.py", "--cpu", "--nproc", "8", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["parameters"] == 16 * (16384 * 16384 + 16384)
    assert info["optimizer"] == "sgd-momentum"
    assert info["fits"]["ddp"] is False and info["auto"] == "fsdp"


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("x = torch.randn(3).sum().item()\n    model = torch.nn.Linear(2, 2)\n"
         "    ctx.setup(model)\n",
         "big_train.py raised RuntimeError before its ctx.setup(model, ...), run with every "
         "tensor on the meta device: "),
        ("model = torch.nn.Linear(2, 2)\n",
         "big_train.py ran to its end without calling ctx.setup(model, ...); or name a function "
         "of it that returns the model: multigpu estimate big_train.py:build"),
    ],
)  # fmt: skip
def test_a_script_that_cannot_be_estimated_says_how_in_one_line(
    tmp_path: Path, body: str, said: str
) -> None:
    (tmp_path / "big_train.py").write_text(
        f"import torch\nimport multigpu\n\nwith multigpu.init() as ctx:\n    {body}"
    )
    done = _estimate("big_train.py", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("multigpu: error: "), done.stderr
    assert said in lines[0], lines[0]

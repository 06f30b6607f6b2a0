"""``multigpu ckpt inspect`` / ``convert`` as a user runs them: exit codes, output, files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import multigpu
from multigpu.checkpoint.layout import STATE_FILE
from tests.launch._util import run_multigpu


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ckpts")
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    with multigpu.init(seed=0, accelerator="cpu", environ={}) as ctx:
        ckpt = ctx.checkpointer(root, every_steps=1, model=model)
        ckpt.step()
        ckpt.step()
    return root


def test_inspect_shows_tensors_step_and_health(checkpoints: Path) -> None:
    done = run_multigpu(["ckpt", "inspect", str(checkpoints)], checkpoints)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "model/0.weight" in out and "3×4" in out and "float32" in out
    assert "step 2, saved by 1 rank(s)" in out and "newest complete: step-00000002" in out
    done = run_multigpu(
        ["ckpt", "inspect", str(checkpoints / "step-00000001"), "--json"], checkpoints
    )
    info = json.loads(done.stdout)
    assert info["step"] == 1 and info["complete"] and info["total_numel"] == 4 * 3 + 3 + 3 * 2 + 2
    assert info["objects"] == {"model": "module"}


def test_inspect_of_a_corrupt_checkpoint_exits_1_and_names_the_problem(
    checkpoints: Path, tmp_path: Path
) -> None:
    import shutil

    broken = tmp_path / "step-00000002"
    shutil.copytree(checkpoints / "step-00000002", broken)
    data = bytearray((broken / STATE_FILE).read_bytes())
    data[-100] ^= 0xFF
    (broken / STATE_FILE).write_bytes(bytes(data))
    done = run_multigpu(["ckpt", "inspect", str(broken), "--json"], tmp_path)
    assert done.returncode == 1
    problems = json.loads(done.stdout)["problems"]
    assert problems[0] == "state.pt: SHA-256 differs from the manifest (corrupt)"


def test_convert_writes_a_plain_state_dict_and_refuses_to_overwrite(
    checkpoints: Path, tmp_path: Path
) -> None:
    dst = tmp_path / "model.pt"
    done = run_multigpu(["ckpt", "convert", str(checkpoints), str(dst)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "multigpu checkpoint step 2, object 'model'" in done.stdout
    state = torch.load(dst, weights_only=True)
    assert list(state) == ["0.weight", "0.bias", "1.weight", "1.bias"]
    again = run_multigpu(["ckpt", "convert", str(checkpoints), str(dst)], tmp_path)
    assert again.returncode == 2 and "pass --force" in again.stderr
    ddp = tmp_path / "ddp.pt"
    torch.save({f"module.{k}": v for k, v in state.items()}, ddp)
    done = run_multigpu(["ckpt", "convert", str(ddp), str(tmp_path / "plain.pt")], tmp_path)
    assert done.returncode == 0 and "stripped 'module.'" in done.stdout
    assert list(torch.load(tmp_path / "plain.pt", weights_only=True)) == list(state)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["ckpt", "inspect", "missing.pt"], "does not exist"),
        (["ckpt", "convert", "missing.pt", "out.pt"], "does not exist"),
        (["ckpt", "inspect", "."], "directory without checkpoints"),
        (["ckpt", "inspect", "legacy.pt"], "legacy pickle"),
        (["ckpt", "frobnicate"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    tmp_path: Path, argv: list[str], message: str
) -> None:
    torch.save({"x": Path("not a tensor")}, tmp_path / "legacy.pt")  # a pathlib object: not safe
    before = sorted(p.name for p in tmp_path.iterdir())
    done = run_multigpu(argv, tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before

"""``multigpu ckpt convert`` round trip: DCP (2 shards) -> one file -> DCP -> resumed elsewhere.

FSDP on 2 real processes writes the checkpoint (each rank its own shard file); the CLI turns it
into one plain state dict and back into a sharded checkpoint, which loads on 1 process without
sharding and on 2 under FSDP — with the very weights that were saved, bitwise.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import multigpu
from multigpu.testing import run_distributed
from tests.checkpoint import reshard_workers as w
from tests.launch._util import popen_multigpu, run_multigpu


def test_sharded_to_one_file_to_sharded_resumes_on_any_world_size(tmp_path: Path) -> None:
    saved, _ = run_distributed(w.save_sharded_model, world_size=2, args=(str(tmp_path / "ck"),))
    step = tmp_path / "ck" / f"step-{w.STOP:08d}"
    assert sorted(p.name for p in step.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    looking = popen_multigpu(["ckpt", "inspect", str(step), "--json"], tmp_path)
    first = run_multigpu(["ckpt", "convert", str(step), "model.pt"], tmp_path)
    assert first.returncode == 0, first.stderr
    assert "object 'model' (sharded: 2 rank(s), fsdp)" in first.stdout
    plain = torch.load(tmp_path / "model.pt", weights_only=True)
    assert plain.keys() == saved.keys()
    assert all(torch.equal(plain[k], saved[k]) for k in saved)
    _inspected_as_two_shards(looking, saved)
    back = run_multigpu(["ckpt", "convert", "model.pt", "back", "--to", "dcp"], tmp_path)
    assert back.returncode == 0, back.stderr
    alone = w.load_converted(str(tmp_path / "back"), "single")  # 1 process: this one
    pair, _ = run_distributed(w.load_converted, world_size=2, args=(str(tmp_path / "back"), "fsdp"))
    for result in (alone, pair):
        assert result["rest"] == {} and result["step"] == 0
        for state in (result["loaded"], result["resumed"]):
            assert all(torch.equal(state[k], saved[k]) for k in saved)


def _inspected_as_two_shards(
    looking: subprocess.Popen[str], saved: dict[str, torch.Tensor]
) -> None:
    """What ``ckpt inspect --json`` said of the FSDP checkpoint: from the index alone, global
    shapes, every tensor in 2 pieces (a shard per rank), each rank's file holding its own."""
    out, err = looking.communicate(timeout=120)
    assert looking.returncode == 0, err
    info = json.loads(out)
    assert info["world_size"] == 2 and info["complete"] and info["format_version"] == 2
    assert info["strategy"]["strategy"] == "fsdp" and info["strategy"]["mesh"] == {"dp_shard": 2}
    rows = {r["name"].removeprefix("model/"): r for r in info["tensors"]}
    assert rows.keys() == saved.keys()
    assert all(rows[k]["shape"] == list(saved[k].shape) and rows[k]["pieces"] == 2 for k in saved)
    assert info["storage"] == {"model": "dcp", "optimizer": "dcp", "loader": "state"}
    assert info["sharded"]["optimizer"]["stats"] == {"momentum_buffer": len(saved)}
    for rank in (0, 1):  # each rank wrote its half of every tensor, model and optimizer
        shard = info["shards"][f"__{rank}_0.distcp"]
        assert shard["objects"]["model"] == len(saved)
        assert shard["objects"]["optimizer"] >= len(saved)


def test_bad_conversions_are_one_line_exit_2_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from multigpu.cli.main import main

    torch.save({"w": torch.ones(2)}, tmp_path / "model.pt")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    (tmp_path / "m.safetensors").write_bytes(b"never read: the package is missing")
    with multigpu.init(seed=0, accelerator="cpu", environ={}) as ctx:
        net = torch.nn.Linear(2, 2)
        ctx.save(tmp_path / "ck", {"net": net, "optimizer": torch.optim.SGD(net.parameters())})
    capsys.readouterr()  # the save's own log line, when an earlier test set up the CLI's logging
    cases = [
        (["model.pt", "taken", "--to", "dcp", "--force"], "not a multigpu checkpoint"),
        (["model.pt", "new", "--to", "dcp", "--name", "my-model"], "not an identifier"),
        (["model.pt", "taken", "--to", "dcp"], "pass --force"),
        (["model.pt", "new.pt", "--name", "ema"], "drop --name, or add --to dcp"),
        (["ck", "new.pt", "--key", "ema"], "it holds net (module), optimizer (optimizer)"),
        (["ck", "new.pt", "--key", "optimizer"], "naming a module (net)"),
        (["ck/__0_0.distcp", "new.pt"], "pass its directory ck"),
        (["missing", "new.pt"], "missing does not exist"),
    ]
    monkeypatch.chdir(tmp_path)
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    for argv, message in cases:
        code = main(["ckpt", "convert", *argv])
        lines = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and message in lines[0], (argv, lines)
        assert lines[0].startswith("multigpu: error: "), lines  # as every subcommand says it
    monkeypatch.setitem(sys.modules, "safetensors", None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    for argv in (["ck", "new.safetensors"], ["m.safetensors", "new", "--to", "dcp"]):
        assert main(["ckpt", "convert", *argv]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert "pip install 'multigpu[safetensors]'" in line, line
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before


def test_a_checkpoint_of_another_shape_is_a_one_line_usage_error(tmp_path: Path) -> None:
    with multigpu.init(seed=0, accelerator="cpu", environ={}) as ctx:
        ctx.save(tmp_path / "small", {"model": torch.nn.Linear(4, 3)})
        with pytest.raises(multigpu.CheckpointError) as caught:
            ctx.load(tmp_path / "small", {"model": torch.nn.Linear(5, 3)})
    assert isinstance(caught.value, multigpu.UsageError)  # the user's choice: exit code 2
    message = str(caught.value)
    assert "\n" not in message
    assert "model.weight (3, 4) in the checkpoint vs (3, 5) here" in message


def test_safetensors_both_ways(tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    from multigpu.cli.ckpt import ckpt_main

    state = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2)}
    torch.save(state, tmp_path / "plain.pt")
    assert (
        ckpt_main(["convert", str(tmp_path / "plain.pt"), str(tmp_path / "ck"), "--to", "dcp"]) == 0
    )
    assert ckpt_main(["convert", str(tmp_path / "ck"), str(tmp_path / "m.safetensors")]) == 0
    from safetensors.torch import load_file

    loaded = load_file(str(tmp_path / "m.safetensors"))
    assert loaded.keys() == state.keys() and all(torch.equal(loaded[k], state[k]) for k in state)
    assert (
        ckpt_main(
            ["convert", str(tmp_path / "m.safetensors"), str(tmp_path / "ck2"), "--to", "dcp"]
        )
        == 0
    )
    from multigpu.checkpoint.native.sharded import read_whole

    again = read_whole(tmp_path / "ck2")["model"]
    assert all(torch.equal(again[k], state[k]) for k in state)

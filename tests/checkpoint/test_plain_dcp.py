"""Checkpoints multigpu did not write: directories of ``torch.distributed.checkpoint.save`` (flat,
nested, torchtitan's step directories) and ``torch.save``d optimizers — inspected, converted
and loaded as a plain torch script or torchtitan left them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

import multigpu
from multigpu.cli.ckpt import ckpt_main
from multigpu.testing import run_distributed
from tests.checkpoint import foreign_workers as w


def _trained() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = w.net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.arange(6)).sum().backward()
    optimizer.step()
    return model, optimizer


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_flat_and_nested_dcp_directories_convert_inspect_and_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, optimizer = _trained()
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    dcp.save(model.state_dict(), checkpoint_id=tmp_path / "flat", no_dist=True)
    dcp.save(
        {
            "model": get_model_state_dict(model),
            "optim": get_optimizer_state_dict(model, optimizer),
            "step": 5,
        },
        checkpoint_id=tmp_path / "nested",
        no_dist=True,
    )
    dcp.save({"student": weights, "teacher": weights}, checkpoint_id=tmp_path / "two", no_dist=True)
    for src in ("flat", "nested/.metadata"):  # the index stands for its directory
        assert ckpt_main(["convert", str(tmp_path / src), str(tmp_path / f"{src[:4]}.pt")]) == 0
        assert _equal(torch.load(tmp_path / f"{src[:4]}.pt", weights_only=True), weights)
    said = capsys.readouterr().out
    assert "5 tensors from DCP checkpoint, object 'model', the top-level tensors" in said
    assert ckpt_main(["inspect", str(tmp_path / "nested"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "DCP checkpoint" and info["complete"] and info["model"] == "model"
    assert info["objects"] == {"model": "model", "optim": "optimizer", "step": "values"}
    assert [r["name"] for r in info["tensors"]] == [f"model/{k}" for k in weights]
    assert info["sharded"]["optim"]["stats"] == {"step": 5, "exp_avg": 5, "exp_avg_sq": 5}
    assert ckpt_main(["inspect", str(tmp_path / "two")]) == 0
    assert "model: not one model state dict; convert and load_weights need --key" in (
        capsys.readouterr().out
    )
    shutil.copytree(tmp_path / "flat", tmp_path / "cut")
    shard = tmp_path / "cut" / "__0_0.distcp"  # cut short: inspect says so, exit 1
    shard.write_bytes(shard.read_bytes()[:-100])
    assert ckpt_main(["inspect", str(tmp_path / "cut"), "--json"]) == 1
    said = json.loads(capsys.readouterr().out)["problems"]
    assert said == [f"__0_0.distcp: {shard.stat().st_size} bytes, the index reads up to "
                    f"{shard.stat().st_size + 100} (truncated)"]  # fmt: skip
    # Several models: the choice is the user's, with what there is in the message.
    with pytest.raises(multigpu.UsageError, match="holds 2 model state dicts among student"):
        multigpu.load_weights(w.net(), tmp_path / "two")
    report = multigpu.load_weights(fresh := w.net(), tmp_path / "two", key="teacher")
    assert report.source == "DCP checkpoint, object 'teacher'" and _equal(
        fresh.state_dict(), weights
    )
    with pytest.raises(
        multigpu.UsageError, match="'optim' of .* is optim \\(optimizer: 15 tensors"
    ):
        multigpu.load_weights(w.net(), tmp_path / "nested", key="optim")
    # ctx.load: the model and the optimizer (saved keyed by parameter names), the rest returned.
    with multigpu.init(seed=1, accelerator="cpu", environ={}) as ctx:
        fresh = w.net()
        again, opt = ctx.setup(fresh, torch.optim.AdamW(fresh.parameters(), lr=0.5))
        assert ctx.load(tmp_path / "nested", {"model": again, "optim": opt}) == {"step": 5}
        plain = ctx.setup(w.net())
        assert ctx.load(tmp_path / "flat" / ".metadata", {"model": plain}) == {}
    assert _equal(again.state_dict(), weights) and _equal(plain.state_dict(), weights)
    saved, loaded = optimizer.state_dict(), opt.state_dict()
    assert loaded["param_groups"][0]["lr"] == 0.01
    assert all(_equal(loaded["state"][i], saved["state"][i]) for i in saved["state"])


def test_a_torch_saved_optimizer_is_described_not_reported_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, optimizer = _trained()
    torch.save(optimizer.state_dict(), tmp_path / "opt.pt")
    assert ckpt_main(["inspect", str(tmp_path / "opt.pt"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "optimizer state dict" and len(info["tensors"]) == 15
    assert info["optimizer"]["params_with_state"] == 5
    assert info["optimizer"]["stats"] == {"step": 5, "exp_avg": 5, "exp_avg_sq": 5}
    assert info["optimizer"]["param_groups"][0]["params"] == 5
    assert ckpt_main(["inspect", str(tmp_path / "opt.pt")]) == 0
    out = capsys.readouterr().out
    assert "15 tensors," in out and "0 tensors" not in out
    assert "optimizer: 5 parameters with state (step 5, exp_avg 5, exp_avg_sq 5)" in out
    assert "param groups (1): 5 params, lr 0.01" in out


@pytest.mark.requires("module:safetensors")
def test_under_fsdp_a_torchtitan_directory_and_safetensors_load_each_rank_its_part(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors.torch import save_file

    torch.manual_seed(3)
    weights = {k: v.clone() for k, v in w.net().state_dict().items()}
    save_file(weights, tmp_path / "m.safetensors")
    titan, saved = tmp_path / "checkpoint" / "step-1", tmp_path / "saved"
    ranks = run_distributed(
        w.fsdp_reads, world_size=2, args=(str(tmp_path / "m.safetensors"), str(titan), str(saved))
    )
    written = ranks[0]["titan"]
    for result in ranks:
        assert result["titan_rest"] == {
            "lr_scheduler": {"last_epoch": 1},
            "dataloader": {"dp_rank_0": b"\x00", "world_size": 2},
            "train_state": {"step": 1, "ntokens_seen": 6},
        }
        assert result["hub_rest"] == {}
        assert result["misfit"].startswith(f"the weights in {tmp_path / 'm.safetensors'} do not")
        assert "1.weight (13, 8) in the files vs (14, 8)" in result["misfit"]
    assert _equal(ranks[0]["from_titan"], written) and _equal(ranks[0]["from_hub"], weights)
    # Each rank read its own rows of every tensor: together, every byte once.
    (read0, total), (read1, _) = ranks[0]["read"][0], ranks[1]["read"][0]
    assert 0 < read0 < total and 0 < read1 < total and read0 + read1 == total
    # The torchtitan directory, as multigpu's commands see it.
    assert ckpt_main(["convert", str(titan), str(tmp_path / "titan.pt")]) == 0
    assert (
        "from torchtitan step directory, object 'model', the top-level" in capsys.readouterr().out
    )
    assert _equal(torch.load(tmp_path / "titan.pt", weights_only=True), written)
    assert ckpt_main(["inspect", str(titan), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "torchtitan step directory (DCP)" and info["step"] == 1
    assert info["objects"] == {
        "model": "model",
        "optimizer": "optimizer",
        "lr_scheduler": "values",
        "dataloader": "values",
        "train_state": "values",
    }
    assert [r["name"] for r in info["tensors"]] == list(written)
    assert all(r["pieces"] == 2 for r in info["tensors"])  # a shard from each rank
    assert sorted(info["shards"]) == ["__0_0.distcp", "__1_0.distcp"]
    assert ckpt_main(["inspect", str(saved)]) == 0
    units = json.loads((saved / "manifest.json").read_text())["strategy"]["units"]
    assert f"FSDP units ({len(units)}): {', '.join(units)}" in capsys.readouterr().out


def test_a_half_written_dcp_directory_is_said_in_one_line_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    model, _ = _trained()
    whole = tmp_path / "whole"
    dcp.save({"model": get_model_state_dict(model), "step": 5}, checkpoint_id=whole, no_dist=True)
    shard = next(p.name for p in whole.glob("*.distcp"))
    cases = {
        "missing": f"the DCP checkpoint {tmp_path / 'missing'} is incomplete: {shard}: missing",
        "truncated": rf"is incomplete: {shard}: \d+ bytes, the index reads up to \d+ \(truncated\)",
        "unindexed": rf"holds DCP shard files \({shard}\) but no \.metadata, which torch\.distrib",
    }
    for name in cases:
        shutil.copytree(whole, tmp_path / name)
    (tmp_path / "missing" / shard).unlink()
    data = (tmp_path / "truncated" / shard).read_bytes()
    (tmp_path / "truncated" / shard).write_bytes(data[: len(data) // 2])
    (tmp_path / "unindexed" / ".metadata").unlink()  # DCP writes it last: a save cut short
    before = sorted(p.name for p in tmp_path.iterdir())
    for name, message in cases.items():
        src = str(tmp_path / name)
        for to in ("file", "dcp", "safetensors"):
            with pytest.raises(multigpu.UsageError, match=message):  # exit 2 from the CLI
                ckpt_main(["convert", src, str(tmp_path / "out"), "--to", to])
        with pytest.raises(multigpu.CheckpointError, match=message):
            multigpu.load_weights(w.net(), src)
        with multigpu.init(seed=0, accelerator="cpu", environ={}) as ctx:
            fresh = ctx.setup(w.net())
            with pytest.raises(multigpu.CheckpointError, match=message):
                ctx.load(src, {"model": fresh})
    assert sorted(p.name for p in tmp_path.iterdir()) == before

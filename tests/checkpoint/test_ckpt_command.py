"""``multigpu ckpt inspect`` / ``convert`` as a user runs them: exit codes, output, files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import multigpu
from multigpu.checkpoint.native.layout import STATE_FILE
from multigpu.checkpoint.native.sharded import read_whole
from tests.checkpoint.test_portable import storages_recorded_as_cuda
from tests.launch._util import popen_multigpu, run_multigpu


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ckpts")
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    with multigpu.init(seed=0, accelerator="cpu", environ={}) as ctx:
        ckpt = ctx.checkpointer(root, every_steps=1, model=model)
        ckpt.step()
        ckpt.step()
    return root


def _run_all(argvs: list[list[str]], cwd: Path) -> list[tuple[int, str, str]]:
    """Run ``python -m multigpu`` once per argv, all at once: each is a fresh interpreter
    importing torch, which dominates the time; returns (exit code, stdout, stderr) each."""
    procs = [popen_multigpu(argv, cwd) for argv in argvs]
    outputs = [p.communicate(timeout=120) for p in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs, strict=True)]


def test_inspect_shows_tensors_step_and_health(checkpoints: Path) -> None:
    (code, out, err), (_, as_json, _) = _run_all(
        [
            ["ckpt", "inspect", str(checkpoints)],
            ["ckpt", "inspect", str(checkpoints / "step-00000001"), "--json"],
        ],
        checkpoints,
    )
    assert code == 0, err
    assert "model/0.weight" in out and "3×4" in out and "float32" in out
    assert "step 2, saved by 1 rank(s)" in out and "newest complete: step-00000002" in out
    assert "sharded (DCP, reshards on load): model 4 tensors" in out
    assert "shard files: __0_0.distcp" in out and "saved under single" in out
    info = json.loads(as_json)
    assert info["step"] == 1 and info["complete"] and info["total_numel"] == 4 * 3 + 3 + 3 * 2 + 2
    assert info["objects"] == {"model": "module"} and info["storage"] == {"model": "dcp"}
    assert info["format_version"] == 2 and info["strategy"] == {"strategy": "single"}
    assert info["sharded"]["model"]["tensors"] == 4 and "__0_0.distcp" in info["files"]


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
    state = read_whole(checkpoints / "step-00000002")["model"]
    with storages_recorded_as_cuda():  # a DDP model's state dict saved on a GPU machine
        torch.save({f"module.{k}": v for k, v in state.items()}, tmp_path / "ddp_cuda.pt")
    (tmp_path / "existing.pt").write_bytes(b"keep me")
    runs = _run_all(
        [
            ["ckpt", "convert", str(checkpoints), "model.pt"],
            ["ckpt", "convert", str(checkpoints), "existing.pt"],
            ["ckpt", "convert", "ddp_cuda.pt", "plain.pt"],
        ],
        tmp_path,
    )
    (code, out, err), (refused, _, why), (ddp_code, ddp_out, ddp_err) = runs
    assert code == 0, err
    assert "multigpu checkpoint step 2, object 'model'" in out
    converted = torch.load(tmp_path / "model.pt", weights_only=True)
    assert list(converted) == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert refused == 2 and "pass --force" in why
    assert (tmp_path / "existing.pt").read_bytes() == b"keep me"
    assert ddp_code == 0, ddp_err
    assert "stripped 'module.'; mapped cuda:0 -> cpu" in ddp_out
    plain = torch.load(tmp_path / "plain.pt")  # plain torch.load works here now: CPU storages
    assert plain.keys() == state.keys() and all(torch.equal(plain[k], state[k]) for k in state)


BAD_INPUT = [
    (["ckpt", "inspect", "missing.pt"], "does not exist"),
    (["ckpt", "convert", "missing.pt", "out.pt"], "does not exist"),
    (["ckpt", "inspect", "."], "directory without checkpoints"),
    (["ckpt", "inspect", "legacy.pt"], "legacy pickle"),
    (["ckpt", "convert", "legacy.pt", "out.pt"], "--trust"),
    (["ckpt", "frobnicate"], "invalid choice"),
]


def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    torch.save({"x": Path("not a tensor")}, tmp_path / "legacy.pt")  # a pathlib object: not safe
    before = sorted(p.name for p in tmp_path.iterdir())
    runs = _run_all([argv for argv, _ in BAD_INPUT], tmp_path)
    for (argv, message), (code, _out, err) in zip(BAD_INPUT, runs, strict=True):
        lines = err.strip().splitlines()
        assert code == 2, (argv, err)
        assert len(lines) == 1 and message in lines[0], (argv, err)
        assert lines[0].startswith("multigpu: error: "), err  # as every subcommand says it
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_format1_checkpoint_is_inspected_and_converted_as_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from multigpu.cli.ckpt import ckpt_main
    from tests.checkpoint.test_portable import FORMAT1

    saved = torch.load(FORMAT1 / "step-00000002" / STATE_FILE, weights_only=True)
    weights = saved["objects"]["model"]
    assert ckpt_main(["inspect", str(FORMAT1)]) == 0
    out = capsys.readouterr().out
    assert "model/0.weight" in out and "3×4" in out and "step 2, saved by 1 rank(s)" in out
    assert "format 1 (before DCP): models and optimizers whole in state.pt" in out
    assert "complete: marker present" in out and "pieces" not in out
    assert ckpt_main(["inspect", str(FORMAT1 / "step-00000002"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format_version"] == 1 and info["objects"] == {
        "model": "module",
        "optimizer": "optimizer",
    }
    assert info["storage"] == {"model": "state", "optimizer": "state"} and info["complete"]
    assert [r["name"] for r in info["tensors"]] == [f"model/{k}" for k in weights]
    assert "sharded" not in info or not info["sharded"]
    # To one plain file, and to a sharded checkpoint that ctx.load takes.
    assert ckpt_main(["convert", str(FORMAT1), str(tmp_path / "m.pt")]) == 0
    assert capsys.readouterr().out == (
        f"wrote {tmp_path / 'm.pt'}: 4 tensors from multigpu checkpoint step 2, object 'model' "
        f"({FORMAT1 / 'step-00000002'})\n"
    )
    plain = torch.load(tmp_path / "m.pt", weights_only=True)
    assert plain.keys() == weights.keys() and all(torch.equal(plain[k], weights[k]) for k in plain)
    assert ckpt_main(["convert", str(FORMAT1), str(tmp_path / "dcp"), "--to", "dcp"]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"wrote {tmp_path / 'dcp'}: 4 tensors from multigpu checkpoint step 2")
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    with multigpu.init(seed=1, accelerator="cpu", environ={}) as ctx:
        assert ctx.load(tmp_path / "dcp", {"model": model}) == {}
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    assert ckpt_main(["inspect", str(tmp_path / "dcp")]) == 0
    assert f"saved under converted from {FORMAT1}" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dcp", "m.pt"]  # no temp left


def test_an_index_naming_other_classes_is_refused_unless_trusted(
    checkpoints: Path, tmp_path: Path
) -> None:
    import collections
    import pickle
    import shutil

    from multigpu.checkpoint.dispatch import summarize
    from multigpu.checkpoint.native.sharded import read_metadata

    step = tmp_path / "step-00000002"
    shutil.copytree(checkpoints / "step-00000002", step)
    metadata = read_metadata(step)
    metadata.planner_data = collections.Counter(metadata.planner_data)  # not on the allow-list
    (step / ".metadata").write_bytes(pickle.dumps(metadata))
    refused = summarize(step)
    assert not refused["complete"] and refused["tensors"] == []
    said = refused["problems"][-1]
    assert "collections.Counter is not a class a DCP metadata file holds" in said
    assert said.endswith("only if you trust its source, pass --trust")
    trusted = summarize(step, trust=True)  # the index is read; its checksum still differs
    assert [r["name"] for r in trusted["tensors"]][:1] == ["model/0.weight"]
    assert [p.split(":")[0] for p in trusted["problems"]] == [".metadata"]

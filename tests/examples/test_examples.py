"""The README's library example, docs/checkpoints.md's resume example and the built-in
``multigpu train`` job, run as a user would."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch

from multigpu.examples.digits import DigitsCNN
from tests.launch._util import run_multigpu

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = ROOT / "examples" / "minimal.py"
RESUME = ROOT / "examples" / "resume.py"


def test_readme_shows_the_minimal_example_verbatim():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert MINIMAL.read_text() in blocks


def test_minimal_example_gives_the_same_losses_on_one_and_two_processes(tmp_path: Path):
    one = tmp_path / "one"
    two = tmp_path / "two"
    one.mkdir()
    two.mkdir()
    alone = run_multigpu(["run", "--cpu", "1", str(MINIMAL)], one)
    pair = run_multigpu(["run", "--cpu", "2", str(MINIMAL)], two)
    assert alone.returncode == 0 and pair.returncode == 0, alone.stderr + pair.stderr
    lines = [ln for ln in pair.stdout.splitlines() if ln.startswith("epoch")]
    assert len(lines) == 3  # rank 0 only
    assert lines == [ln for ln in alone.stdout.splitlines() if ln.startswith("epoch")]
    state = torch.load(two / "model.pt", weights_only=True)
    assert list(state) == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_multigpu_train_defaults_reach_95_percent_on_two_processes(tmp_path: Path):
    # The README's command as written: no --out, so the launcher picks runs/digits/1.
    done = run_multigpu(["train", "--cpu", "2"], tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "runs" / "digits" / "1"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["device"] == "cpu"
    assert metrics["strategy"] == "ddp" and metrics["epochs"] == len(metrics["history"])
    assert metrics["test_accuracy"] >= 0.95
    assert metrics["samples_per_second"] > 0 and metrics["seconds"] > 0
    model = DigitsCNN()
    model.load_state_dict(torch.load(out / "model.pt", weights_only=True))  # plain, CPU
    assert "test accuracy" in done.stdout
    assert {p.name for p in out.iterdir()} - {"loss.png"} == {
        "checkpoints", "metrics.json", "model.pt"
    }  # fmt: skip
    # once an epoch (22 steps), the 3 newest kept; the README quotes the last line's command
    newest = "runs/digits/1/checkpoints/step-00000264"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "step-00000220", "step-00000242", "step-00000264"
    ]  # fmt: skip
    assert done.stdout.splitlines()[-1].endswith(f"(multigpu ckpt inspect {newest})")
    assert f"multigpu ckpt inspect {newest}" in (ROOT / "README.md").read_text()


def test_checkpoint_docs_show_the_resume_example_verbatim():
    docs = (ROOT / "docs" / "checkpoints.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", docs, flags=re.S)
    assert RESUME.read_text() in blocks


def test_resume_example_continues_from_its_newest_checkpoint_at_another_world_size(
    tmp_path: Path,
):
    first = run_multigpu(["run", "--cpu", "1", str(RESUME)], tmp_path)
    assert first.returncode == 0, first.stderr
    ckpt = tmp_path / "runs" / "ckpt"
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "step-00000120",
        "step-00000140",
        "step-00000160",
    ]
    for name in ("step-00000140", "step-00000160"):  # as if the run had died after step 120
        shutil.rmtree(ckpt / name)
    again = run_multigpu(["run", "--cpu", "2", str(RESUME)], tmp_path)
    assert again.returncode == 0, again.stderr
    epochs = [ln for ln in again.stdout.splitlines() if ln.startswith("epoch")]
    assert epochs[0].startswith("epoch 8 step 128")  # resumed at step 120, mid-epoch 8
    assert epochs[-1] == first.stdout.strip().splitlines()[-1]  # same final loss (4 decimals)

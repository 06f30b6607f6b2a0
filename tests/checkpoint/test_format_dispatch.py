"""One door for every checkpoint format: ``checkpoint.dispatch.format_of`` on real files.

Every format a reader accepts (ours, from ``ctx.save`` and a ``Checkpointer``, old and new; plain
DCP, flat and nested, or its ``.metadata``; safetensors, a file or a hub directory; a
``torch.save`` file) is recognised for each caller (``ctx.load``: ``state``; ``load_weights``
and ``ckpt convert``: ``weights``; ``ckpt inspect``: ``inspect``), and what is no checkpoint is
said in the one line that caller has always said.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

import multigpu
from multigpu.checkpoint.dispatch import FORMATS, format_of
from multigpu.errors import CheckpointUnreadableError, UsageError

DATA = Path(__file__).parent / "data"


def _safetensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """A safetensors file written by hand (its format: the header's length, a JSON header, the
    tensors' bytes), so that the test needs no safetensors package to make one."""
    header: dict[str, object] = {}
    data = b""
    for name, tensor in tensors.items():
        raw = tensor.contiguous().numpy().tobytes()
        header[name] = {
            "dtype": "F32",
            "shape": list(tensor.shape),
            "data_offsets": [len(data), len(data) + len(raw)],
        }
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("formats")
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2)
    state = {k: v.detach().clone() for k, v in net.state_dict().items()}
    paths = {
        "saved": root / "saved",
        "runs": root / "runs",
        "flat": root / "flat",
        "nested": root / "nested",
        "file": root / "model.safetensors",
        "hub": root / "hub",
        "sharded hub": root / "sharded-hub",
        "pt": root / "model.pt",
        "notes": root / "notes",
        "unindexed": root / "unindexed",
        "broken runs": root / "broken-runs",
    }
    with multigpu.init(seed=0, accelerator="cpu", environ={}) as ctx:
        model = ctx.setup(net)
        ctx.save(paths["saved"], {"model": model, "step": 3})
        ctx.checkpointer(paths["runs"], model=model).save()
    dcp.save(dict(state), checkpoint_id=paths["flat"], no_dist=True)
    dcp.save({"model": dict(state), "step": 5}, checkpoint_id=paths["nested"], no_dist=True)
    _safetensors(paths["file"], state)
    paths["hub"].mkdir()
    _safetensors(paths["hub"] / "model.safetensors", state)
    paths["sharded hub"].mkdir()
    _safetensors(paths["sharded hub"] / "model-00001-of-00001.safetensors", state)
    (paths["sharded hub"] / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {k: "model-00001-of-00001.safetensors" for k in state}})
    )
    torch.save(state, paths["pt"])
    paths["notes"].mkdir()
    (paths["notes"] / "notes.txt").write_text("not a checkpoint")
    shutil.copytree(paths["nested"], paths["unindexed"])
    (paths["unindexed"] / ".metadata").unlink()  # DCP writes it last: a save cut short
    shutil.copytree(paths["runs"], paths["broken runs"])
    for step in paths["broken runs"].glob("step-*"):
        (step / "COMMITTED").unlink()
    return paths


def _step(root: Path) -> Path:
    (step,) = sorted(root.glob("step-*"))
    return step


def test_every_format_is_found_for_every_caller(made: dict[str, Path]) -> None:
    runs_step = _step(made["runs"])
    old = DATA / "format1"  # a Checkpointer's directory written before checkpoints used DCP
    cases = {
        # path: (kind, what ctx.load / load_weights read, what ckpt inspect describes)
        made["saved"]: ("multigpu", made["saved"], made["saved"]),
        made["runs"]: ("multigpu", runs_step, made["runs"]),
        runs_step: ("multigpu", runs_step, runs_step),
        runs_step / ".metadata": ("multigpu", runs_step, runs_step),
        old: ("multigpu", _step(old), old),
        made["flat"]: ("dcp", made["flat"], made["flat"]),
        made["nested"]: ("dcp", made["nested"], made["nested"]),
        made["nested"] / ".metadata": ("dcp", made["nested"], made["nested"]),
        made["file"]: ("hub", made["file"], made["file"]),
        made["hub"]: ("hub", made["hub"], made["hub"]),
        made["sharded hub"]: ("hub", made["sharded hub"], made["sharded hub"]),
    }
    for path, (kind, read, described) in cases.items():
        for purpose in ("state", "weights"):
            found = format_of(path, purpose=purpose)
            assert (found.kind, found.path) == (kind, read), (path, purpose)
            assert found.format is FORMATS[kind] and found.format.name == kind
        found = format_of(path, purpose="inspect")
        assert (found.kind, found.path) == (kind, described), path
    # A torch.save file: read by load_weights, convert and inspect; ctx.load wants a directory.
    for purpose in ("weights", "inspect"):
        assert format_of(made["pt"], purpose=purpose).kind == "torch"
    assert set(FORMATS) == {"multigpu", "dcp", "hub", "torch"}


def test_what_is_no_checkpoint_is_said_in_the_callers_one_line(made: dict[str, Path]) -> None:
    missing = made["notes"].parent / "missing"
    notes, unindexed, broken = made["notes"], made["unindexed"], made["broken runs"]
    shard = next(unindexed.glob("*.distcp"))
    not_a_directory = (
        "is not a checkpoint directory; expected a path given to ctx.save, a Checkpointer's "
        "directory, a DCP checkpoint directory or safetensors weights"
    )
    unfinished = (
        f"{unindexed} holds DCP shard files ({shard.name}) but no .metadata, which "
        "torch.distributed.checkpoint.save writes last: a save that did not finish, or a copy "
        "without it; take another checkpoint, or copy it whole"
    )
    cases = [
        # (path, purpose, error type, the whole message)
        (missing, "state", CheckpointUnreadableError, f"{missing} {not_a_directory}"),
        (made["pt"], "state", CheckpointUnreadableError, f"{made['pt']} {not_a_directory}"),
        (
            missing,
            "weights",
            UsageError,
            f"{missing} does not exist; expected a checkpoint file or directory",
        ),
        (
            missing,
            "inspect",
            UsageError,
            f"{missing} does not exist; expected a checkpoint file or directory",
        ),
        (
            notes,
            "state",
            CheckpointUnreadableError,
            f"{notes} holds no complete checkpoint; see 'multigpu ckpt inspect {notes}'",
        ),
        (
            notes,
            "weights",
            UsageError,
            f"{notes} is a directory without a checkpoint; expected a step-XXXXXXXX directory, "
            "a directory of them, a DCP checkpoint directory (with .metadata), a directory of "
            "safetensors weights (model.safetensors or its index), or a file",
        ),
        (
            notes,
            "inspect",
            UsageError,
            f"{notes} is a directory without checkpoints; expected step-* inside",
        ),
        (
            broken,
            "state",
            CheckpointUnreadableError,
            f"{broken} holds no complete checkpoint; see 'multigpu ckpt inspect {broken}'",
        ),
        (
            broken,
            "weights",
            CheckpointUnreadableError,
            f"{broken} holds checkpoints but none is complete; see "
            f"'multigpu ckpt inspect {broken}'",
        ),
        (
            shard,
            "weights",
            UsageError,
            f"{shard} is one file of a sharded (DCP) checkpoint; pass its directory {unindexed}",
        ),
    ]
    cases += [(unindexed, p, CheckpointUnreadableError, unfinished) for p in ("state", "weights")]
    cases += [(unindexed, "inspect", CheckpointUnreadableError, unfinished)]
    for path, purpose, error, message in cases:
        with pytest.raises(error, match=f"^{re.escape(message)}$"):
            format_of(path, purpose=purpose)
    # A Checkpointer's directory with no complete checkpoint is still described by inspect.
    assert format_of(broken, purpose="inspect").kind == "multigpu"
    # One broken checkpoint, named: its problems are said (ctx.load and load_weights alike).
    step = _step(broken)
    for purpose in ("state", "weights"):
        with pytest.raises(CheckpointUnreadableError, match=f"^checkpoint {step} is not usable"):
            format_of(step, purpose=purpose)

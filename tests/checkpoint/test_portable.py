"""``multigpu.load_weights``: checkpoints saved by every common set-up load into a plain model.

Refusals (legacy pickles, foreign files, ambiguity, misfits) are in ``test_portable_errors``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import multigpu
from multigpu.checkpoint.portable import read_weights
from multigpu.testing import run_distributed
from tests.checkpoint import workers


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    # On the CPU: DataParallel moves the module it wraps to GPU 0 where there is one.
    return sa.keys() == sb.keys() and all(torch.equal(sa[k].cpu(), sb[k].cpu()) for k in sa)


@contextlib.contextmanager
def storages_recorded_as_cuda() -> Iterator[None]:
    """Make ``torch.save`` record every CPU storage as ``cuda:0``, as it does on a GPU machine.

    ``torch.save`` asks the taggers of ``torch.serialization``'s package registry, lowest
    priority value first, where each storage lives, and writes that string into the file; at
    load time the string picks the deserializer (``cuda:0`` → "move to CUDA", which fails without
    a GPU unless ``map_location`` says otherwise). A tagger registered at priority 0 answers
    "cuda:0" for CPU storages, so the file is what a CUDA machine writes except that the bytes
    came from CPU memory. It is removed from the registry afterwards.
    """
    registry = torch.serialization._package_registry
    before = list(registry)
    torch.serialization.register_package(
        0, lambda s: "cuda:0" if s.device.type == "cpu" else None, lambda s, loc: None
    )
    try:
        yield
    finally:
        registry[:] = before


def test_dataparallel_checkpoint_loads_without_module_prefix(tmp_path: Path) -> None:
    source = _model()
    torch.save(torch.nn.DataParallel(source).state_dict(), tmp_path / "dp.pt")
    target = _model()
    report = multigpu.load_weights(target, tmp_path / "dp.pt")
    assert _same(target, source)
    assert report.prefixes_stripped == ("module.",) and report.source == "plain state dict"


def test_ddp_checkpoint_from_real_processes_loads(tmp_path: Path) -> None:
    keys = run_distributed(
        workers.save_ddp_state_dict, world_size=2, args=(str(tmp_path / "d.pt"),)
    )
    assert keys[0][0].startswith("module.")
    target = _model()
    report = multigpu.load_weights(target, tmp_path / "d.pt")
    assert report.prefixes_stripped == ("module.",) and report.tensors == 4


def test_compiled_model_checkpoint_nested_under_a_key_loads(tmp_path: Path) -> None:
    source = _model()
    compiled = torch.compile(source)
    assert next(iter(compiled.state_dict())).startswith("_orig_mod.")
    torch.save({"epoch": 7, "state_dict": compiled.state_dict()}, tmp_path / "c.pt")
    target = _model()
    report = multigpu.load_weights(target, tmp_path / "c.pt")
    assert _same(target, source)
    assert report.source == "dict key 'state_dict'" and report.prefixes_stripped == ("_orig_mod.",)
    # Into a wrapped model too: its plain module gets the weights.
    wrapped = torch.nn.DataParallel(_model())
    multigpu.load_weights(wrapped, tmp_path / "c.pt")
    assert _same(wrapped.module, source)


def test_a_cuda_saved_checkpoint_loads_on_the_cpu(tmp_path: Path) -> None:
    source = _model()
    with storages_recorded_as_cuda():
        torch.save(source.state_dict(), tmp_path / "cuda.pt")
    if not torch.cuda.is_available():
        # The file really claims CUDA storages: torch's own error on a machine without CUDA.
        with pytest.raises(RuntimeError, match="Attempting to deserialize object on a CUDA"):
            torch.load(tmp_path / "cuda.pt")
    target = _model()
    report = multigpu.load_weights(target, tmp_path / "cuda.pt")
    assert _same(target, source)
    assert dict(report.devices_mapped) == {"cuda:0": "cpu"}
    assert "mapped cuda:0 -> cpu" in str(report)


def test_our_checkpoints_load_from_the_root_or_a_step_and_say_which(tmp_path: Path) -> None:
    source = _model()
    with multigpu.init(seed=0, accelerator="cpu", environ={}) as ctx:
        optimizer = torch.optim.SGD(source.parameters(), lr=0.1)
        ckpt = ctx.checkpointer(tmp_path / "ck", model=source, optimizer=optimizer)
        ckpt.step()
        first = ckpt.save()
        with torch.no_grad():
            source[0].weight.add_(1)
        ckpt.step()
        second = ckpt.save()
        ctx.save(tmp_path / "final", {"net": source, "optimizer": optimizer, "epoch": 3})
    target = _model()
    report = multigpu.load_weights(target, tmp_path / "ck")
    assert _same(target, source) and report.path == second  # the directory, not its state.pt
    assert report.source == (
        "multigpu checkpoint step 2, object 'model' (sharded: 1 rank(s), single)"
    )
    report = multigpu.load_weights(target, first)
    assert "step 1" in report.source and not _same(target, source)
    # A ctx.save directory: its only module is the model, whatever its name.
    report = multigpu.load_weights(target, tmp_path / "final")
    assert _same(target, source) and "object 'net' (sharded" in report.source
    state, report = read_weights(second / "state.pt")  # its state.pt: the same
    assert state.keys() == source.state_dict().keys() and report.path == second
    with pytest.raises(multigpu.UsageError, match=r"is the optimizer .* a module \(model\)"):
        read_weights(tmp_path / "ck", key="optimizer")  # refused before it is read
    with pytest.raises(multigpu.UsageError, match="pass its directory"):
        multigpu.load_weights(target, second / "__0_0.distcp")


FORMAT1 = Path(__file__).parent / "data" / "format1"
"""A checkpoint written by multigpu before DCP (format 1): see data/README.md."""


def test_a_format1_checkpoint_loads_as_it_did() -> None:
    saved = torch.load(FORMAT1 / "step-00000002" / "state.pt", weights_only=True)
    assert saved["version"] == 1 and saved["objects"]["model"]["0.weight"].shape == (3, 4)
    target = _model()
    report = multigpu.load_weights(target, FORMAT1)
    assert target.state_dict().keys() == saved["objects"]["model"].keys()
    assert all(torch.equal(v, saved["objects"]["model"][k]) for k, v in target.state_dict().items())
    assert report.source == "multigpu checkpoint step 2, object 'model'"
    assert report.path == FORMAT1 / "step-00000002" and report.tensors == 4
    with pytest.raises(multigpu.UsageError, match="key='ema' is not in .* model \\(module\\)"):
        multigpu.load_weights(target, FORMAT1, key="ema")


def test_ambiguity_and_mismatch_are_errors(tmp_path: Path) -> None:
    a, b = _model(), _model()
    torch.save(
        {"model_state_dict": a.state_dict(), "state_dict": b.state_dict()}, tmp_path / "x.pt"
    )
    with pytest.raises(multigpu.UsageError, match="pass key=NAME"):
        multigpu.load_weights(_model(), tmp_path / "x.pt")
    target = _model()
    multigpu.load_weights(target, tmp_path / "x.pt", key="state_dict")
    assert _same(target, b)
    with pytest.raises(multigpu.CheckpointError, match="do not fit Linear"):
        multigpu.load_weights(torch.nn.Linear(4, 3), tmp_path / "x.pt", key="state_dict")
    report = multigpu.load_weights(
        torch.nn.Sequential(torch.nn.Linear(4, 3)),
        tmp_path / "x.pt",
        key="state_dict",
        strict=False,
    )
    assert report.unexpected_keys == ("1.weight", "1.bias")

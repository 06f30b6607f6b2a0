"""``multigpu.load_weights`` on files it must refuse or must not guess about, with real files.

Legacy pickles (a whole pickled model, a state dict inside a custom class) load only with
``trust=True``; files that are not PyTorch files never get that advice; an ambiguous choice
names the candidates; a model that does not fit is left untouched.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import multigpu


class Net(torch.nn.Module):
    """A model that owns a submodule really named ``module`` (as some architectures do)."""

    def __init__(self) -> None:
        super().__init__()
        self.module = torch.nn.Linear(4, 3)
        self.head = torch.nn.BatchNorm1d(3)


class StateBox(dict):  # type: ignore[type-arg]
    """A state dict inside a custom class: unpickling it imports and builds this class."""


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    # On the CPU: DataParallel moves the module it wraps to GPU 0 where there is one.
    return sa.keys() == sb.keys() and all(torch.equal(sa[k].cpu(), sb[k].cpu()) for k in sa)


def _randomised() -> Net:
    net = Net()
    with torch.no_grad():
        net.head.running_mean.uniform_()
    return net


def test_a_whole_pickled_model_needs_trust_and_then_loads(tmp_path: Path) -> None:
    source = _randomised()
    torch.save(source, tmp_path / "whole.pt")  # the legacy way: pickles the class
    with pytest.raises(multigpu.CheckpointError) as refused:
        multigpu.load_weights(Net(), tmp_path / "whole.pt")
    message = str(refused.value)
    assert "legacy pickle" in message and "test_portable_errors.Net" in message
    assert "arbitrary code" in message and "trust=True (CLI: --trust)" in message
    assert "\n" not in message
    target = Net()
    report = multigpu.load_weights(target, tmp_path / "whole.pt", trust=True)
    assert _same(target, source) and report.trusted
    assert report.source == "pickled Net module" and "trusted pickle" in str(report)


def test_a_state_dict_inside_a_custom_class_needs_trust(tmp_path: Path) -> None:
    source = _randomised()
    torch.save({"epoch": 3, "model": StateBox(source.state_dict())}, tmp_path / "box.pt")
    with pytest.raises(multigpu.CheckpointError, match=r"holds .*StateBox.*trust=True"):
        multigpu.load_weights(Net(), tmp_path / "box.pt")
    target = Net()
    report = multigpu.load_weights(target, tmp_path / "box.pt", trust=True)
    assert _same(target, source) and report.source == "dict key 'model'"


@pytest.mark.parametrize("trust", [False, True])
def test_a_file_that_is_not_a_pytorch_file_is_never_told_to_trust(
    tmp_path: Path, trust: bool
) -> None:
    (tmp_path / "notes.pt").write_text("hello, these are not weights\n")
    good = tmp_path / "good.pt"
    torch.save(Net().state_dict(), good)
    (tmp_path / "cut.pt").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    for name in ("notes.pt", "cut.pt"):
        with pytest.raises(multigpu.CheckpointError, match="not a readable PyTorch file") as e:
            multigpu.load_weights(Net(), tmp_path / name, trust=trust)
        assert "trust" not in str(e.value) and "\n" not in str(e.value)


def test_prefixes_are_stripped_only_where_that_matches_the_model(tmp_path: Path) -> None:
    source = _randomised()
    # DataParallel around torch.compile around a model with its own "module" submodule.
    wrapped = torch.nn.DataParallel(torch.compile(source)).state_dict()
    assert next(iter(wrapped)) == "module._orig_mod.module.weight"
    torch.save(wrapped, tmp_path / "wrapped.pt")
    target = Net()
    report = multigpu.load_weights(target, tmp_path / "wrapped.pt")
    assert _same(target, source) and report.prefixes_stripped == ("module.", "_orig_mod.")
    torch.save(source.state_dict(), tmp_path / "plain.pt")  # "module.weight" is a real name
    report = multigpu.load_weights(Net(), tmp_path / "plain.pt")
    # (On a GPU machine DataParallel moved source to cuda:0: the report also says "mapped";
    # the path itself, test_prefixes_are_stripped_..., says "stripped".)
    assert report.prefixes_stripped == () and "; stripped" not in str(report)


def test_stripping_keeps_the_per_module_versions_load_state_dict_reads() -> None:
    from multigpu.checkpoint.formats.keys import strip_common_prefixes

    state = torch.nn.DataParallel(Net()).state_dict()
    stripped, prefixes = strip_common_prefixes(state)
    assert prefixes == ("module.",) and list(stripped) == list(Net().state_dict())
    assert stripped._metadata["head"] == {"version": 2}  # BatchNorm's, under its new name


def test_ambiguity_is_an_error_naming_the_candidates(tmp_path: Path) -> None:
    a, b = _randomised(), _randomised()
    torch.save({"model_state_dict": a.state_dict(), "ema": b.state_dict()}, tmp_path / "two.pt")
    torch.save({"model": a.state_dict(), "net": b.state_dict()}, tmp_path / "usual.pt")
    with pytest.raises(multigpu.UsageError, match=r"\['model', 'net'\]; pass key=NAME"):
        multigpu.load_weights(Net(), tmp_path / "usual.pt")
    target = Net()
    report = multigpu.load_weights(target, tmp_path / "two.pt")  # one usual key: no guess
    assert _same(target, a) and report.source == "dict key 'model_state_dict'"
    multigpu.load_weights(target, tmp_path / "two.pt", key="ema")
    assert _same(target, b)
    with pytest.raises(multigpu.UsageError, match="key 'epoch'.* holds a int, not a model"):
        torch.save({"epoch": 3, "state_dict": a.state_dict()}, tmp_path / "e.pt")
        multigpu.load_weights(Net(), tmp_path / "e.pt", key="epoch")


def test_our_checkpoint_with_two_models_needs_a_key(tmp_path: Path) -> None:
    student, teacher = _randomised(), _randomised()
    with multigpu.init(seed=0, accelerator="cpu", environ={}) as ctx:
        ctx.checkpointer(tmp_path, student=student, teacher=teacher).save()
    with pytest.raises(multigpu.UsageError, match=r"student \(module\), teacher \(module\)"):
        multigpu.load_weights(Net(), tmp_path)
    target = Net()
    report = multigpu.load_weights(target, tmp_path, key="teacher")
    assert _same(target, teacher) and "object 'teacher' (sharded" in report.source


def test_a_model_that_does_not_fit_is_left_untouched(tmp_path: Path) -> None:
    source = _randomised()
    partial = {k: v for k, v in source.state_dict().items() if k.startswith("module.")}
    torch.save(partial, tmp_path / "partial.pt")
    target = Net()
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(multigpu.CheckpointError, match=r"missing 5: head.weight.*strict=False"):
        multigpu.load_weights(target, tmp_path / "partial.pt")
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())
    report = multigpu.load_weights(target, tmp_path / "partial.pt", strict=False)
    assert torch.equal(target.module.weight, source.module.weight)
    # 4, not 5: for a file without per-module versions BatchNorm fills num_batches_tracked in.
    assert report.missing_keys[:2] == ("head.weight", "head.bias") and "missing 4" in str(report)
    with pytest.raises(
        multigpu.CheckpointError, match=r"shapes differ .*weight \(3, 4\) vs \(3, 3\)"
    ):
        multigpu.load_weights(torch.nn.Linear(3, 3), tmp_path / "partial.pt")


def test_a_narrower_dtype_is_cast_and_said(tmp_path: Path) -> None:
    source = _randomised().half()
    torch.save(source.state_dict(), tmp_path / "half.pt")
    target = Net()
    report = multigpu.load_weights(target, tmp_path / "half.pt")
    assert report.dtype_casts == ("float16 -> float32 (6 tensors)",)
    assert target.module.weight.dtype == torch.float32
    assert torch.equal(target.module.weight, source.module.weight.float())


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_asking_for_a_device_this_machine_lacks_says_so(tmp_path: Path) -> None:
    torch.save(Net().state_dict(), tmp_path / "m.pt")
    with pytest.raises(multigpu.CheckpointError, match="cannot put the tensors .* on cuda"):
        multigpu.load_weights(Net(), tmp_path / "m.pt", map_location="cuda")


def test_a_sharded_checkpoint_that_does_not_fit_is_refused_before_any_copy(
    tmp_path: Path,
) -> None:
    with multigpu.init(seed=0, accelerator="cpu", environ={}) as ctx:
        ctx.save(tmp_path / "net", {"model": _randomised()})
    target = torch.nn.Sequential(torch.nn.Linear(4, 3))
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(multigpu.CheckpointError) as refused:
        multigpu.load_weights(target, tmp_path / "net")
    message = str(refused.value)
    assert message.startswith(f"the weights in {tmp_path / 'net'} do not fit Sequential: ")
    assert "missing 2: 0.weight, 0.bias" in message and "\n" not in message
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())
    report = multigpu.load_weights(Net(), tmp_path / "net", strict=True)
    assert report.tensors == 7 and "(sharded: 1 rank(s), single)" in report.source

"""Hugging Face architectures under ddp and the default fsdp: two processes train like one.

Built from small configs (tests/zoo/models.py): a decoder with tied embeddings (GPT-2), a
Llama-style decoder, an encoder with a tied decoder head (BERT), an encoder-decoder sharing one
embedding three ways (T5) and a vision transformer. Each is also resumed under fsdp on two
processes from a one-process checkpoint, which continues exactly where the one process went on,
and the two-process fsdp checkpoint is exported to the Hugging Face layout that transformers'
``from_pretrained`` loads. Two process starts in all.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from multigpu.cli.main import main
from multigpu.testing import run_distributed
from tests.zoo import workers
from tests.zoo.models import ZOO, dataset

pytestmark = pytest.mark.requires("module:transformers")


def assert_close(
    a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], rtol: float = 1e-5
) -> None:
    """Every tensor within ``rtol`` of the other's largest value, or 1e-9 absolute: an attention
    key's bias gets no gradient but rounding (softmax ignores it), so it stays near 1e-13 and
    only an absolute bound says anything of it."""
    assert a.keys() == b.keys()
    for k in b:
        diff = (a[k] - b[k]).abs().max().item()
        assert diff <= rtol * b[k].abs().max().item() + 1e-9, (k, diff)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("zoo")


@pytest.fixture(scope="module")
def alone(root: Path) -> dict[str, Any]:
    (result,) = run_distributed(workers.one_process, world_size=1, args=(str(root),), timeout=240)
    return result  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def two(root: Path, alone: dict[str, Any]) -> dict[str, Any]:
    rank0, rank1 = run_distributed(
        workers.two_processes, world_size=2, args=(str(root),), timeout=300
    )
    assert rank0.pop("device") == rank1.pop("device") == "cpu"
    assert all(run["state"] == {} for run in rank1.values())  # gathered on rank 0 alone
    for key, run in rank0.items():
        assert run["losses"] == rank1[key]["losses"], key  # the loss every rank logs
    return rank0  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", list(ZOO))
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_train_like_one(
    name: str, strategy: str, alone: dict[str, Any], two: dict[str, Any]
) -> None:
    one, run = alone[name], two[f"{strategy}-{name}"]
    assert len(run["losses"]) == workers.STEPS
    assert run["losses"] == pytest.approx(one["losses"], rel=1e-5)
    assert_close(run["state"], one["state"])
    assert run["state"].keys() == one["state"].keys()  # tied weights saved as the model has them


@pytest.mark.parametrize("name", list(ZOO))
def test_default_fsdp_shards_each_block_as_a_unit(name: str, two: dict[str, Any]) -> None:
    units = two[f"fsdp-{name}"]["describe"]["units"]
    assert units == [*ZOO[name].units, "<root>"]  # the blocks (T5: two per stack), the root


@pytest.mark.parametrize("name", list(ZOO))
def test_a_one_process_checkpoint_resumes_under_fsdp_on_two(
    name: str, alone: dict[str, Any], two: dict[str, Any]
) -> None:
    resumed = two[f"resumed-{name}"]
    assert len(resumed["losses"]) == workers.STEPS - workers.SAVE_AT
    assert resumed["losses"] == pytest.approx(alone[name]["losses"][workers.SAVE_AT :], rel=1e-5)
    assert_close(resumed["state"], alone[name]["state"])


@pytest.mark.parametrize("name", list(ZOO))
def test_pretrained_weights_load_into_a_meta_built_model_under_fsdp(
    name: str, alone: dict[str, Any], two: dict[str, Any]
) -> None:
    loaded = two[f"pretrained-{name}"]["state"]
    for key, value in alone[name]["state"].items():
        assert torch.equal(loaded[key], value), key  # read from safetensors, slice by slice


def hub_layout(directory: Path) -> tuple[list[str], dict[str, Any]]:
    """The files of a sharded hub directory and its index (weight map, sizes)."""
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    return sorted(p.name for p in directory.glob("*.safetensors")), index


@pytest.mark.parametrize("name", list(ZOO))
def test_an_fsdp_checkpoint_exports_to_what_from_pretrained_loads(
    name: str, root: Path, two: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    arch = ZOO[name]
    model = arch.build()
    trained = two[f"fsdp-{name}"]["state"]
    model.load_state_dict(trained)
    ref = root / f"ref-{name}"  # what transformers writes: the files to match, the config.json
    model.save_pretrained(ref, max_shard_size="40KB")  # type: ignore[operator]
    config = ref / "config.json"  # names the architecture, as a downloaded one does
    src = root / f"fsdp-{name}" / f"step-{workers.STEPS:08d}"
    dst = root / f"hub-{name}"
    argv = ["ckpt", "convert", str(src), str(dst), "--to", "safetensors", "--config", str(config)]
    assert main([*argv, "--max-shard-size", "40KB"]) == 0, capsys.readouterr().err
    assert (dst / "model.safetensors.index.json").is_file()  # sharded: 40 KB each at most
    assert hub_layout(dst) == hub_layout(ref)  # ViT: the hub's own names, not its modules'
    loaded = type(model).from_pretrained(dst).eval()
    assert loaded.state_dict().keys() == trained.keys()
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, trained[key]), key  # tied weights re-tied from one tensor
    batch = dataset(arch)[:4]
    with torch.no_grad():
        want = model.eval()(**arch.inputs(*batch)).logits
        assert torch.equal(loaded(**arch.inputs(*batch)).logits, want)

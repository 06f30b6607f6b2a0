"""The model zoo on one GPU (skipped without one): the CPU zoo's workers on CUDA and NCCL;
``tests/zoo/test_zoo_training.py`` says what is proven.

On one GPU, fsdp is one rank: what is checked is that the tied weights, the default units, the
meta-device initialisation, the loading of ``save_pretrained`` weights slice by slice, the
resume and the export work on CUDA tensors, and give what the unsharded GPU run gives.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from multigpu.cli.main import main
from multigpu.testing import run_distributed
from tests.zoo import workers
from tests.zoo.models import ZOO
from tests.zoo.test_zoo_training import assert_close

pytestmark = [pytest.mark.requires("gpus>=1"), pytest.mark.requires("module:transformers")]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("zoo-gpu")


@pytest.fixture(scope="module")
def runs(root: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    (alone,) = run_distributed(
        workers.one_process, world_size=1, args=(str(root),), device="cuda", timeout=300
    )
    (sharded,) = run_distributed(
        workers.sharded_alone, world_size=1, args=(str(root),), device="cuda", timeout=300
    )
    assert sharded["device"] == "cuda:0"
    return alone, sharded


@pytest.mark.parametrize("name", list(ZOO))
def test_the_zoo_on_one_gpu_under_fsdp_trains_resumes_and_loads_like_single(
    name: str, root: Path, runs: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    alone, sharded = runs
    assert sharded[f"fsdp-{name}"]["losses"] == pytest.approx(alone[name]["losses"], rel=1e-4)
    assert_close(sharded[f"fsdp-{name}"]["state"], alone[name]["state"], rtol=1e-4)
    assert_close(sharded[f"resumed-{name}"]["state"], alone[name]["state"], rtol=1e-4)
    for key, value in alone[name]["state"].items():
        assert torch.equal(sharded[f"pretrained-{name}"]["state"][key], value), key
    src = root / f"fsdp-{name}" / f"step-{workers.STEPS:08d}"
    model = ZOO[name].build()
    config = root / f"pretrained-{name}" / "config.json"  # save_pretrained's: the architecture
    argv = ["ckpt", "convert", str(src), str(root / f"hub-{name}"), "--to", "safetensors"]
    assert main([*argv, "--config", str(config)]) == 0
    loaded = type(model).from_pretrained(root / f"hub-{name}")
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, sharded[f"fsdp-{name}"]["state"][key]), key

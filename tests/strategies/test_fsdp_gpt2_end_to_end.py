"""A user's Hugging Face GPT-2 script under ``multigpu verify --strategy fsdp``, end to end.

The script (``scripts/gpt2_train.py``) ties its head to its token embedding. Under the old
default units (``transformer``, ``lm_head``, the root) the tie was split between two units and
the first forward failed at every world size; now the units are the two blocks and the root,
and 2 processes train as 1 does. Two ``multigpu run`` children (world sizes 1 and 2), ~20 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent / "scripts" / "gpt2_train.py"
UNITS = "units ['transformer.h.0', 'transformer.h.1', '<root>'], tied True"


@pytest.mark.requires("module:transformers")
def test_verify_passes_a_gpt2_script_sharded_per_block_at_world_sizes_1_and_2(
    tmp_path: Path,
) -> None:
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)
    keep = tmp_path / "runs"
    argv = ["verify", "--cpu", "--strategy", "fsdp", "--steps", "6", "--keep", str(keep)]
    done = subprocess.run(
        [sys.executable, "-m", "multigpu", *argv, "--json", str(SCRIPT)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["verdict"] == "PASS" and result["world_sizes"] == [1, 2], result
    (c,) = result["comparisons"]
    assert c["steps"] == c["reference_steps"] == 6
    assert c["losses"]["compared"] == 6 and c["losses"]["max_rel_diff"] <= 1e-6
    for n in (1, 2):  # one unit per block and the root; the head still the embedding
        assert f"strategy fsdp, {UNITS}" in (keep / f"ws{n}.stdout.log").read_text()
    one, two = (torch.load(keep / f"ws{n}" / "params.pt") for n in (1, 2))
    assert one.keys() == two.keys()
    for params in (one, two):  # trained as one weight
        assert torch.equal(params["lm_head.weight"], params["transformer.wte.weight"])
    for name, tensor in one.items():
        if name.endswith("attn.c_attn.bias"):  # its key third gets no gradient (below)
            q_and_v = (
                torch.cat([tensor[:128], tensor[256:]]),
                torch.cat([two[name][:128], two[name][256:]]),
            )
            assert _relative(*q_and_v) <= 1e-5, name
            # softmax does not change when a constant is added to every score, so the key bias
            # has a zero gradient but for rounding, which AdamW scales up to steps of ±lr:
            # noise near zero, different at each world size
            assert tensor[128:256].abs().max() < 1e-4 and two[name][128:256].abs().max() < 1e-4
        else:
            assert _relative(tensor, two[name]) <= 1e-5, name


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / a.abs().max())

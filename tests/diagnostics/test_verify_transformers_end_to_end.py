"""``multigpu verify --strategy fsdp`` on Hugging Face models of four families, end to end.

Their attention key biases get a gradient that is zero but for rounding (softmax ignores a
constant added to every score): at world sizes 1 and 2 they differ by 1e-15 to 4e-6, as much as
their own size, while every other tensor agrees within 2e-5 (``scripts/hf_family.py``: tiny
configs built in code, dropout off). Each verify is two ``multigpu run`` children that import
transformers (~35 s on 2 cores); the FAIL costs a third.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.diagnostics.test_verify_end_to_end import verify

SCRIPT = Path(__file__).resolve().parent / "scripts" / "hf_family.py"
KEY_BIASES = {  # the tensors whose gradient is rounding noise, by family
    "opt": [f"model.decoder.layers.{i}.self_attn.k_proj.bias" for i in (0, 1)],
    "distilbert": [f"distilbert.transformer.layer.{i}.attention.k_lin.bias" for i in (0, 1)],
    **{
        family: [
            "model.encoder.layers.0.self_attn.k_proj.bias",
            "model.decoder.layers.0.self_attn.k_proj.bias",
            "model.decoder.layers.0.encoder_attn.k_proj.bias",
        ]
        for family in ("bart", "marian")
    },
}


def _run(tmp_path: Path, *argv: str) -> tuple[int, dict[str, Any]]:
    done = verify(
        ["--strategy", "fsdp", "--nproc", "1,2", "--steps", "3", "--json", str(SCRIPT), *argv],
        tmp_path,
        timeout=400,
    )
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


@pytest.mark.requires("module:transformers")
@pytest.mark.parametrize(
    ("family", "optimizer"),
    [("opt", "--sgd"), ("distilbert", ""), ("bart", "--sgd"), ("marian", "")],
)
def test_a_transformers_model_passes_with_its_key_biases_judged_at_noise_level(
    tmp_path: Path, family: str, optimizer: str
) -> None:
    code, result = _run(tmp_path, "--family", family, *filter(None, [optimizer]))
    assert code == 0 and result["verdict"] == "PASS", result
    (c,) = result["comparisons"]
    assert c["noise_level"] == result["noise_level"] == KEY_BIASES[family], c["noise_level"]
    tensors = {t["name"]: t for t in c["tensors"]}
    adam = result["l2_rtol"] is not None  # AdamW: judged by L2 (else by the largest element)
    judged = "l2_rel_diff" if adam else "max_rel_diff"
    for name in KEY_BIASES[family]:  # beyond tolerance: without the judgement, a FAIL
        t = tensors[name]
        assert t["ok"] and t["noise_level"] and t[judged] > (1e-2 if adam else 1e-4), t
        assert t["max_abs_diff"] < 1e-5  # rounding noise, amplified by Adam
    others = [t for t in c["tensors"] if not t.get("noise_level")]
    assert all(t["ok"] and "noise_level" not in t for t in others)
    assert c[judged] == max(t[judged] for t in others) <= 1e-5  # the noise left out
    assert c["losses"]["compared"] == 3 and c["losses"]["max_rel_diff"] <= 1e-6
    assert result["reasons"] == [] and result["gradient_dtype"] == "float32"


@pytest.mark.requires("module:transformers")
def test_opt_on_data_that_depends_on_the_world_size_still_fails_and_its_label_shift_is_not_padding(
    tmp_path: Path,
) -> None:
    code, result = _run(tmp_path, "--family", "opt", "--per-rank-data")
    assert code == 1 and result["verdict"] == "FAIL", result
    (c,) = result["comparisons"]
    assert c["losses"]["first_differing_step"] == 1
    failing = [t["name"] for t in c["tensors"] if not t["ok"]]
    assert len(failing) >= len(c["tensors"]) // 2, failing
    assert c["noise_level"] == KEY_BIASES["opt"]  # still noise: not what fails the run
    # transformers ignores the last target of each sequence (its one-token label shift): the
    # same share in every micro-batch, weighed alike at any world size; not "padding"
    (reason,) = result["reasons"]
    assert reason.startswith("the loaders' number of samples differs between runs (64 at world")

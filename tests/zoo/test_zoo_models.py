"""The zoo's models are those docs/bring-your-model.md describes: parameters and tied weights
(no processes; the units are checked where fsdp chose them, test_zoo_training.py)."""

from __future__ import annotations

import pytest

from tests.zoo.models import ZOO, describe

pytestmark = pytest.mark.requires("module:transformers")

TABLE = {
    "gpt2": (27_904, [["transformer.wte.weight", "lm_head.weight"]]),
    "llama": (22_688, []),
    "bert": (
        20_832,
        [
            ["bert.embeddings.word_embeddings.weight", "cls.predictions.decoder.weight"],
            ["cls.predictions.bias", "cls.predictions.decoder.bias"],
        ],
    ),
    "t5": (
        43_520,
        [
            [
                "shared.weight",
                "encoder.embed_tokens.weight",
                "decoder.embed_tokens.weight",
                "lm_head.weight",
            ]
        ],
    ),
    "vit": (23_652, []),
}
"""What the docs' table says of each model."""


@pytest.mark.parametrize("name", list(ZOO))
def test_each_model_has_the_parameters_and_ties_the_docs_give(name: str) -> None:
    assert describe(ZOO[name]) == {"params": TABLE[name][0], "tied": TABLE[name][1]}

"""FSDP's units on the models people bring: Hugging Face models from small configs, no processes.

Each model's own declaration (``_no_split_modules``) names its blocks; tied embeddings and heads
(GPT-2, Llama with ``tie_word_embeddings``, BERT's masked-LM head, T5's shared embedding in
encoder, decoder and head) must never be split between two units.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from torch import nn

from multigpu.strategies.fsdp_units import plan_units
from tests.zoo.models import tied_names

pytestmark = pytest.mark.requires("module:transformers")


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    """transformers warns about the small configs' token ids (not what is tested)."""
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000))


def _llama(tied: bool) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=1000,
            tie_word_embeddings=tied,
        )
        return LlamaForCausalLM(config)

    return build


def _bert(cls: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import transformers

        config = transformers.BertConfig(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            vocab_size=1000,
        )
        return getattr(transformers, cls)(config)  # type: ignore[no-any-return]

    return build


def _t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16, vocab_size=1000)
    return T5ForConditionalGeneration(config)


def _vit() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        image_size=32,
        patch_size=8,
        num_labels=10,
    )
    return ViTForImageClassification(config)


def _unit_of(holder: str, units: list[str]) -> str:
    """The unit whose module holds ``holder`` (a module path): the longest prefix, else root."""
    inside = [u for u in units if holder == u or holder.startswith(f"{u}.")]
    return max(inside, key=len, default="<root>")


CASES: list[tuple[str, Callable[[], nn.Module], str, list[str], int]] = [
    ("gpt2", _gpt2, "GPT2Block", ["transformer.h.0", "transformer.h.1"], 1),
    ("llama", _llama(False), "LlamaDecoderLayer", ["model.layers.0", "model.layers.1"], 0),
    ("llama-tied", _llama(True), "LlamaDecoderLayer", ["model.layers.0", "model.layers.1"], 1),
    # its embeddings are declared a block, but hold the head's weight: they stay with the root
    ("bert-mlm", _bert("BertForMaskedLM"), "BertEmbeddings, BertLayer",
     ["bert.encoder.layer.0", "bert.encoder.layer.1"], 2),
    ("bert", _bert("BertModel"), "BertEmbeddings, BertLayer",
     ["embeddings", "encoder.layer.0", "encoder.layer.1"], 0),
    ("t5", _t5, "T5Block",
     ["encoder.block.0", "encoder.block.1", "decoder.block.0", "decoder.block.1"], 1),
    ("vit", _vit, "ViTEmbeddings, ViTLayer", ["vit.embeddings", "vit.layers.0", "vit.layers.1"], 0),
]  # fmt: skip


@pytest.mark.parametrize(
    ("build", "declared", "blocks", "ties"), [case[1:] for case in CASES], ids=[c[0] for c in CASES]
)
def test_the_declared_blocks_are_the_units_and_tied_weights_stay_in_one(
    build: Callable[[], nn.Module], declared: str, blocks: list[str], ties: int
) -> None:
    model = build()
    plan = plan_units(model)
    assert plan.names == [*blocks, "<root>"]
    assert str(plan.choice) == f"declared: {declared}"
    assert len(tied_names(model)) == ties  # the configs tie what they are meant to
    for names in tied_names(model):  # every holder of a tied weight in one unit of the plan
        holders = {_unit_of(name.rpartition(".")[0], plan.names[:-1]) for name in names}
        assert len(holders) == 1, (names, holders)


def test_t5_shares_one_embedding_between_encoder_decoder_and_head() -> None:
    model: Any = _t5()
    assert model.encoder.embed_tokens.weight is model.shared.weight is model.lm_head.weight
    # as the stacks: both hold the shared embedding the head holds too, so neither is a unit
    from transformers.models.t5.modeling_t5 import T5Stack

    stacks = plan_units(model, blocks=(T5Stack,))
    assert stacks.names == ["<root>"]
    assert stacks.warning is not None and "FSDPStrategy(blocks=(T5Block,))" in stacks.warning
    embeddings = plan_units(model, blocks=(nn.Embedding,))  # the shared three go to the root
    assert [n.rsplit(".", 1)[-1] for n in embeddings.names[:-1]] == ["relative_attention_bias"] * 2


def test_a_hugging_face_model_inside_the_users_module_keeps_its_blocks() -> None:
    from transformers import GPT2Config, GPT2Model

    class Classifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.backbone = GPT2Model(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100))
            self.head = nn.Linear(64, 3)

    assert plan_units(Classifier()).names == ["backbone.h.0", "backbone.h.1", "<root>"]


def test_llama_with_its_embeddings_most_of_the_model_is_warned() -> None:
    plan = plan_units(_llama(False)())  # 128k of 202k in the untied embedding and head
    assert plan.warning is not None
    assert plan.warning.startswith("FSDP unit <root> holds 63% of the model's 202,048 parameters")
    assert "FSDPStrategy(blocks=(LlamaDecoderLayer, nn.Embedding))" in plan.warning
    assert plan_units(_gpt2()).warning is None

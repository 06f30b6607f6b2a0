"""The model zoo: Hugging Face architectures built from small configs (no hub download).

Each entry builds a model whose dropout is off (a run on N processes draws other dropout masks
than one process: the comparison would measure the masks, not the strategy), a dataset of
tensors for ``ctx.loader`` and the loss of one batch, computed by the model itself (``labels=``)
as a user's script would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

VOCAB = 64
SEQ = 12
SAMPLES = 64
BATCH = 16  # global


@dataclass(frozen=True)
class Arch:
    """One architecture of the zoo."""

    name: str
    build: Callable[[], nn.Module]
    data: Callable[[torch.Generator], TensorDataset]
    inputs: Callable[..., dict[str, torch.Tensor]]
    """The model's keyword arguments (labels included) from one batch of ``data``."""
    units: tuple[str, ...] = ()
    """The default FSDP units (docs/bring-your-model.md's table), the root last."""

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return model(**self.inputs(*batch)).loss  # type: ignore[no-any-return]


def _tokens(g: torch.Generator) -> TensorDataset:
    ids = torch.randint(0, VOCAB, (SAMPLES, SEQ), generator=g)
    ids[:, 1::2] = (ids[:, 0::2] * 3 + 1) % VOCAB  # something to learn
    return TensorDataset(ids)


def _causal(ids: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"input_ids": ids, "labels": ids}


def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=SEQ, bos_token_id=0,
        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
    )  # fmt: skip
    return GPT2LMHeadModel(config)  # lm_head.weight is transformer.wte.weight


def llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=VOCAB, max_position_embeddings=SEQ, bos_token_id=0,
        eos_token_id=0, pad_token_id=None, tie_word_embeddings=False, use_cache=False,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def bert() -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=SEQ, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, pad_token_id=0,
    )  # fmt: skip
    return BertForMaskedLM(config)  # the decoder's weight is the word embedding's


def _masked(ids: torch.Tensor) -> dict[str, torch.Tensor]:
    masked = ids.clone()
    masked[:, 2::3] = 1  # the [MASK] of this vocabulary
    return {"input_ids": masked, "labels": ids}


def t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2,
        dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
        use_cache=False,
    )  # fmt: skip
    return T5ForConditionalGeneration(config)  # encoder, decoder and head share one embedding


def _seq2seq(ids: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"input_ids": ids, "labels": ids.flip(1)}


def vit() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=16, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=2, intermediate_size=64, num_labels=4, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    return ViTForImageClassification(config)


def _images(g: torch.Generator) -> TensorDataset:
    x = torch.randn(SAMPLES, 3, 16, 16, generator=g)
    y = torch.randint(0, 4, (SAMPLES,), generator=g)
    return TensorDataset(x, y)


def _classify(x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"pixel_values": x, "labels": y}


ZOO = {
    arch.name: arch
    for arch in (
        Arch("gpt2", gpt2, _tokens, _causal, ("transformer.h.0", "transformer.h.1")),
        Arch("llama", llama, _tokens, _causal, ("model.layers.0", "model.layers.1")),
        Arch("bert", bert, _tokens, _masked, ("bert.encoder.layer.0", "bert.encoder.layer.1")),
        Arch(
            "t5",
            t5,
            _tokens,
            _seq2seq,
            ("encoder.block.0", "encoder.block.1", "decoder.block.0", "decoder.block.1"),
        ),
        Arch("vit", vit, _images, _classify, ("vit.embeddings", "vit.layers.0", "vit.layers.1")),
    )
}


def dataset(arch: Arch) -> TensorDataset:
    """The same samples on every rank and world size."""
    return arch.data(torch.Generator().manual_seed(11))


def tied_names(model: nn.Module) -> list[list[str]]:
    """The names of each parameter held under several names (tied weights)."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def describe(arch: Arch) -> dict[str, Any]:
    """Parameters and tied groups of ``arch``'s model (docs/bring-your-model.md's table)."""
    model = arch.build()
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "tied": tied_names(model),
    }

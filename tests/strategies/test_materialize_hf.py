"""A Hugging Face model built on the meta device is initialised by its own scheme, module by
module, and a tensor that scheme leaves untouched is refused by name (no processes)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from multigpu.errors import UsageError
from multigpu.strategies.materialize import materialize

pytestmark = pytest.mark.requires("module:transformers")


def _toy(with_odd: bool) -> nn.Module:
    from transformers import PretrainedConfig, PreTrainedModel

    class Odd(nn.Module):  # owns a tensor, has no reset_parameters, and _init_weights skips it
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.zeros(3))

    class Toy(PreTrainedModel):
        config_class = PretrainedConfig

        def __init__(self, config: PretrainedConfig) -> None:
            super().__init__(config)
            self.emb = nn.Embedding(5, 4)  # has reset_parameters, and _init_weights redraws it
            self.head = nn.Linear(4, 5, bias=False)
            self.head.weight = self.emb.weight  # tied after both drew, as HF ties
            self.odd = Odd() if with_odd else None
            self.post_init()

        def _init_weights(self, module: nn.Module) -> None:
            if isinstance(module, nn.Embedding):
                nn.init.constant_(module.weight, 0.5)
            elif isinstance(module, nn.Linear):
                nn.init.constant_(module.weight, -1.0)

    return Toy(PretrainedConfig())


def test_the_models_own_scheme_initialises_it_and_a_tied_weight_keeps_its_first_values() -> None:
    with torch.device("meta"):
        model = _toy(with_odd=False)
    materialize(model, torch.device("cpu"))
    assert torch.equal(model.emb.weight, torch.full((5, 4), 0.5))  # the scheme's, not garbage
    assert model.head.weight is model.emb.weight  # still tied, the embedding's values kept
    assert not any(hasattr(p, "_is_hf_initialized") for p in model.parameters())  # marks gone


def test_a_tensor_the_scheme_leaves_untouched_is_refused_by_name() -> None:
    with torch.device("meta"):
        model = _toy(with_odd=True)
    with pytest.raises(UsageError, match=r"left odd\.w \(Odd\) uninitialised"):
        materialize(model, torch.device("cpu"))


def test_a_parent_that_draws_its_children_again_is_followed_as_post_init_follows_it() -> None:
    # GPT-2's _init_weights of an attention or MLP module draws its c_proj again, scaled by the
    # depth: 0.02 / sqrt(2 * 8) = 0.005 for 8 layers, where the Conv1D's own draw is 0.02.
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=8, n_embd=64, n_head=2, vocab_size=64, n_positions=16)
    with torch.device("meta"):
        model = GPT2LMHeadModel(config)
    materialize(model, torch.device("cpu"))
    block = model.transformer.h[0]
    assert float(block.attn.c_proj.weight.std()) == pytest.approx(0.005, rel=0.1)
    assert float(block.mlp.c_proj.weight.std()) == pytest.approx(0.005, rel=0.1)
    assert float(block.attn.c_attn.weight.std()) == pytest.approx(0.02, rel=0.1)
    assert model.lm_head.weight is model.transformer.wte.weight

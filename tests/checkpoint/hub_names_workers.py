"""Models and workers of ``test_hub_names`` (module-level: ``run_distributed`` pickles them by
name): small Hugging Face models whose modules transformers 5 names otherwise than the hub."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

import multigpu


def vit_model() -> nn.Module:
    """A ViT encoder (``ViTModel``: its conversion mapping is keyed by that class name)."""
    import transformers

    config = transformers.ViTConfig(
        image_size=16, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=2, intermediate_size=64,
    )  # fmt: skip
    return transformers.ViTModel(config, add_pooling_layer=False)


def neox() -> nn.Module:
    """A GPT-NeoX (Pythia's architecture): its head is ``lm_head`` here, ``embed_out`` on the hub,
    by a mapping keyed by the class name ``GPTNeoXForCausalLM`` — which FSDP changes."""
    import transformers

    config = transformers.GPTNeoXConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=16, tie_word_embeddings=False,
    )  # fmt: skip
    return transformers.GPTNeoXForCausalLM(config)


def mixtral() -> nn.Module:
    """A Mixtral: its experts are one tensor here, one per expert on the hub (a conversion)."""
    import transformers

    config = transformers.MixtralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, num_local_experts=2,
        num_experts_per_tok=1, max_position_embeddings=16,
    )  # fmt: skip
    return transformers.MixtralForCausalLM(config)


class Scorer(nn.Module):
    """A user's own model holding a Hugging Face one under ``lm``: GPT-NeoX's anchored rename
    (``^embed_out.`` -> ``lm_head.``) applies to the names under ``lm.`` only by its scope."""

    def __init__(self) -> None:
        super().__init__()
        self.lm = neox()
        self.score = nn.Linear(32, 1)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.score(self.lm.gpt_neox(input_ids).last_hidden_state)


def load_under_fsdp(sources: dict[str, str]) -> dict[str, Any]:
    """Each model of ``sources`` ({"vit" | "scorer": hub-format path}) built on the meta device,
    set up under fsdp (the root wrapped: its class is FSDP's) and loaded from its path: the
    whole state, on rank 0."""
    builders = {"vit": vit_model, "scorer": Scorer}
    out: dict[str, Any] = {}
    with multigpu.init(strategy="fsdp", seed=0) as ctx:
        for name, path in sources.items():
            with ctx.init_module():
                net = builders[name]()
            model = ctx.setup(net)
            ctx.load(Path(path), {"model": model})
            out[name] = ctx.full_state_dict(model)
    return out

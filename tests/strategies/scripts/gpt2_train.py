"""A user's script: a Hugging Face GPT-2 (its head tied to its token embedding) on random tokens.

``multigpu verify --strategy fsdp`` runs it at world sizes 1 and 2; rank 0 prints the FSDP units.
``build`` is the model alone, for ``multigpu estimate .../gpt2_train.py:build``.
Dropout is off: a script that verify compares must draw nothing per rank.
"""

import torch
from torch.utils.data import TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel

import multigpu

VOCAB = 1000


def build() -> GPT2LMHeadModel:
    """Two blocks of ~198k parameters; the token embedding (128k) is also the head."""
    config = GPT2Config(
        n_layer=2,
        n_embd=128,
        n_head=4,
        vocab_size=VOCAB,
        n_positions=32,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(config)


def main() -> None:
    with multigpu.init(seed=0) as ctx:
        tokens = torch.randint(0, VOCAB, (128, 16), generator=torch.Generator().manual_seed(0))
        model = build()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model, optimizer = ctx.setup(model, optimizer)
        tied = model.lm_head.weight is model.transformer.wte.weight
        ctx.print(
            f"strategy {ctx.strategy.name}, units {ctx.strategy.describe().get('units')}, "
            f"tied {tied}"
        )
        loader = ctx.loader(TensorDataset(tokens), batch_size=16)
        for _epoch in range(2):
            for (x,) in loader:
                loss = model(input_ids=x, labels=x).loss
                optimizer.zero_grad()
                ctx.backward(loss)
                optimizer.step()
        ctx.print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()

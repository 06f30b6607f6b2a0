"""A language model on padded sequences of different lengths: the loss per token, exact at any scale.

Each micro-batch holds a different number of real tokens (the padding is labelled -100 and left
out of the loss). Averaging the loss per micro-batch (``--naive``) weights a token by one over
its micro-batch's count, which changes with the world size and the accumulation steps; summing
it and passing the count, ``ctx.backward(loss_sum, num_items=n)``, gives the gradient of the
mean over every token of the optimizer step, whatever they are split into.

python examples/padded_lm.py                                            # one process
multigpu run --cpu 2 examples/padded_lm.py --accumulation-steps 4      # the same losses
multigpu verify examples/padded_lm.py --accumulation 1,4 --steps 10    # PASS (--naive: FAIL)
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import multigpu

VOCAB, LENGTH, SEQUENCES = 32, 64, 1024

parser = argparse.ArgumentParser()
parser.add_argument("--accumulation-steps", type=int, default=1)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--naive", action="store_true", help="average the loss per micro-batch")
args = parser.parse_args()


def padded_sequences() -> TensorDataset:
    """Walks of a random Markov chain, 8 to 64 tokens long, padded to 64 (labels: -100)."""
    g = torch.Generator().manual_seed(0)
    chain = torch.softmax(3 * torch.randn(VOCAB, VOCAB, generator=g), dim=1)
    tokens = torch.zeros(SEQUENCES, LENGTH + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(VOCAB, (SEQUENCES,), generator=g)
    for t in range(LENGTH):
        tokens[:, t + 1] = torch.multinomial(chain[tokens[:, t]], 1, generator=g).squeeze(1)
    lengths = torch.randint(8, LENGTH + 1, (SEQUENCES,), generator=g)
    padding = torch.arange(LENGTH)[None, :] >= lengths[:, None]
    inputs, labels = tokens[:, :-1].clone(), tokens[:, 1:].clone()
    inputs[padding], labels[padding] = 0, -100
    return TensorDataset(inputs, labels)


with multigpu.init(seed=0) as ctx:
    model = nn.Sequential(
        nn.Embedding(VOCAB, 64), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, VOCAB)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    model, optimizer = ctx.setup(model, optimizer)
    loader = ctx.loader(
        padded_sequences(), batch_size=32, accumulation_steps=args.accumulation_steps
    )
    for epoch in range(args.epochs):
        for x, y in loader:
            with ctx.accumulate(model):
                logits = model(x).flatten(0, 1)
                if args.naive:  # the mean over this micro-batch's tokens (-100 ignored)
                    loss = F.cross_entropy(logits, y.flatten())
                    ctx.backward(loss)
                else:  # the sum over its tokens, and how many there are
                    loss = F.cross_entropy(logits, y.flatten(), reduction="sum")
                    ctx.backward(loss, num_items=(y != -100).sum())
                ctx.clip_grad_norm(model, optimizer, max_norm=1.0)
                ctx.step(optimizer)
        # The last step's mean per token over every rank and micro-batch (weighted), or the
        # mean of the ranks' last micro-batch means (naive).
        shown = ctx.all_reduce(loss.item()) if args.naive else ctx.step_loss
        ctx.print(f"epoch {epoch} loss per token {shown:.4f}")

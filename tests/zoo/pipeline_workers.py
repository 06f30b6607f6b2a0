"""Module-level workers of the zoo's pipeline test: the decoders split into 2 stages."""

from __future__ import annotations

from importlib import metadata
from typing import Any

import torch
import torch.nn.functional as F
from packaging.version import Version
from torch import nn

import multigpu
from multigpu.runtime.seed import seed_everything
from tests.zoo.models import BATCH, ZOO, dataset

STEPS = 4

LLAMA_BEFORE_5_24 = (
    "transformers before 5.24: Llama's forward (its position ids unsqueezed in the model, then "
    "given to rotary_emb) is cut by torch.distributed.pipelining into a stage whose call of "
    "that module lost its arguments ('Expected positional argument for parameter "
    "unsqueeze_default'); measured: 5.17, 5.20, 5.22 and 5.23 fail, 5.24 passes (torch 2.13)"
)


def _llama_pipelines() -> bool:
    return Version(metadata.version("transformers")) >= Version("5.24")


class Logits(nn.Module):
    """A causal LM as a pipeline takes it: token ids in, logits out (one tensor each)."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=ids).logits  # type: ignore[no-any-return]


def next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


def _run(name: str, schedule: str, raw: bool = False) -> dict[str, Any]:
    """``name``'s model wrapped in ``Logits``, or (``raw``) as transformers builds it, with its
    key-value cache on as decoders have it by default: the last stage then returns the logits."""
    arch = ZOO[name]
    data = dataset(arch)
    example = data[:BATCH][0]
    strategy = multigpu.PipelineStrategy(example_input=example, microbatches=2, schedule=schedule)
    with multigpu.init(strategy=strategy, seed=0) as ctx:
        seed_everything(0)
        lm = arch.build()
        lm.config.use_cache = raw  # type: ignore[union-attr]
        net = lm if raw else Logits(lm)
        unsplit = Logits(arch.build())
        unsplit.lm.load_state_dict(lm.state_dict())
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        ref_opt = torch.optim.SGD(unsplit.parameters(), lr=0.05, momentum=0.9)
        model, opt = ctx.setup(net, opt)
        losses, ref_losses = [], []
        for (ids,) in ctx.loader(data, batch_size=BATCH):
            losses.append(
                float(ctx.forward_backward(model, ids, target=ids, loss_fn=next_token_loss))
            )
            ctx.step(opt)
            ref = next_token_loss(unsplit(ids), ids)  # the same batch on one process, unsplit
            ref.backward()
            ref_opt.step()
            ref_opt.zero_grad()
            ref_losses.append(float(ref))
            if len(losses) == STEPS:
                break
        return {
            "losses": losses,
            "reference_losses": ref_losses,
            "state": ctx.full_state_dict(model),
            "reference": {
                k.removeprefix("lm.") if raw else k: v.detach().clone()
                for k, v in unsplit.state_dict().items()
            },
        }


def decoders(schedule: str) -> dict[str, Any]:
    """Every decoder of the zoo under ``schedule``, each in a context of its own on one process
    group (the outer context owns it)."""
    with multigpu.init(strategy="ddp", seed=0):
        runs = {"gpt2": _run("gpt2", schedule), "gpt2, as built": _run("gpt2", schedule, True)}
        if _llama_pipelines():
            runs["llama"] = _run("llama", schedule)
            runs["llama, as built"] = _run("llama", schedule, raw=True)
        return runs

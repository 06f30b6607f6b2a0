"""Module-level worker functions for run_distributed (importable by spawned children)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import multigpu
from multigpu.session.metrics import Accuracy, Mean, Sum, gather_all, gather_in_dataset_order

NUM_SAMPLES = 1009  # prime: no global batch divides it, so the last batch is always partial
NUM_FEATURES, NUM_CLASSES = 16, 5


def problem() -> tuple[TensorDataset, nn.Module]:
    """A fixed synthetic data set (x, label, dataset index) and a fixed random linear classifier."""
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(NUM_SAMPLES, NUM_FEATURES, generator=gen, dtype=torch.float64)
    teacher = torch.randn(NUM_FEATURES, NUM_CLASSES, generator=gen, dtype=torch.float64)
    noise = 2.0 * torch.randn(NUM_SAMPLES, NUM_CLASSES, generator=gen, dtype=torch.float64)
    y = (x @ teacher + noise).argmax(dim=1)
    model = nn.Linear(NUM_FEATURES, NUM_CLASSES, dtype=torch.float64)
    with torch.no_grad():  # a perturbed teacher: accuracy well away from 0 and 1
        model.weight.copy_(teacher.T + torch.randn(NUM_CLASSES, NUM_FEATURES, generator=gen))
        model.bias.zero_()
    return TensorDataset(x, y, torch.arange(NUM_SAMPLES)), model


def evaluate(ctx: multigpu.Context, dataset: TensorDataset, model: nn.Module, batch: int) -> Any:
    """One evaluation pass at global batch ``batch``, the way docs/api.md tells users to."""
    loader = ctx.loader(dataset, batch_size=batch, shuffle=False)
    # The documented recipe for a shuffle=False loader's dataset indices, taken before the pass.
    sampler_indices = torch.tensor([i for b in loader.sampler for i in b], dtype=torch.int64)
    acc, top3, loss, batch_loss, total = Accuracy(), Accuracy(top_k=3), Mean(), Mean(), Sum()
    preds, seen = [torch.empty(0, dtype=torch.int64)], [torch.empty(0, dtype=torch.int64)]
    batches = 0
    with torch.no_grad():
        for x, y, index in loader:
            logits = model(x)
            acc.update(logits, y)
            top3.update(logits, y)
            loss.update(F.cross_entropy(logits, y, reduction="none"))
            batch_loss.update(F.cross_entropy(logits, y), weight=len(y))
            total.update(y)
            preds.append(logits.argmax(dim=1))
            seen.append(index)
            batches += 1
    local_count = acc.count
    local_pred, local_index = torch.cat(preds), torch.cat(seen)
    return {
        "batches": batches,
        "local_count": local_count,
        "accuracy": acc.compute(),
        "accuracy_again": acc.compute(),  # compute() twice must not double-count
        "count": acc.count,
        "top3": top3.compute(),
        "loss": loss.compute(),
        "loss_count": loss.count,
        "batch_loss": batch_loss.compute(),
        "label_sum": total.compute(),
        "sampler_indices_match": torch.equal(sampler_indices, local_index),
        "rank_major_indices": gather_all(local_index),
        "rank_major_preds": gather_all(local_pred),
        "ordered_preds": gather_in_dataset_order(local_pred, local_index),
        "ordered_indices": gather_in_dataset_order(local_index, sampler_indices),
    }


def evaluate_at(batches: list[int]) -> dict[Any, Any]:
    """Evaluate at each global batch; also a data set smaller than the world (empty ranks)."""
    with multigpu.init(seed=0) as ctx:
        dataset, model = problem()
        out: dict[Any, Any] = {b: evaluate(ctx, dataset, model, b) for b in batches}
        out["world_size"] = ctx.world_size
        if ctx.world_size > 1:
            # world_size - 1 samples: the last rank gets no batch at all and must not hang.
            tiny = TensorDataset(*(t[: ctx.world_size - 1] for t in dataset.tensors))
            out["tiny"] = evaluate(ctx, tiny, model, ctx.world_size)
            out["duplicate_error"] = duplicated_index_error(ctx.rank)
        return out


def duplicated_index_error(rank: int) -> str:
    """Give gather_in_dataset_order index 0 on every rank; return the error (on every rank)."""
    try:
        gather_in_dataset_order(torch.tensor([float(rank)]), torch.tensor([0]))
    except multigpu.UsageError as e:
        return str(e)
    return "no error"

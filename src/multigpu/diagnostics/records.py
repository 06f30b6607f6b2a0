"""What one ``multigpu verify`` run left behind: every rank's record and rank 0's parameters.

The worker side (``multigpu.instruments.verify_record``) writes, in the run's
``MULTIGPU_VERIFY_DIR``, ``rank{r}.json`` per rank and ``params.pt`` (rank 0). The file names are
repeated here rather than imported: diagnostics must not import the training side (it starts workers
as subprocesses), and the format is the contract between the two.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

RANK_FILE = "rank{rank}.json"
"""One rank's record (steps, losses, loaders, dropout modules, dtype, precision)."""

ADAPTIVE_OPTIMIZERS = frozenset(
    {"Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad", "Adadelta", "RMSprop", "SparseAdam"}
)
"""torch optimizers whose step divides each gradient by a running scale of its own."""

PARAMS_FILE = "params.pt"
"""Rank 0's unwrapped ``state_dict`` at the end of the run (CPU tensors)."""


def run_label(world_size: int, accumulation: int | None, *, short: bool = False) -> str:
    """How a run is named in verify's report: by its world size, and by the accumulation steps
    verify asked for (``--accumulation``) if any.

    Example:
        >>> run_label(2, None), run_label(2, 4), run_label(2, 4, short=True)
        ('world size 2', 'world size 2, accumulation 4', '2, acc 4')
    """
    if short:
        return str(world_size) if accumulation is None else f"{world_size}, acc {accumulation}"
    text = f"world size {world_size}"
    return text if accumulation is None else f"{text}, accumulation {accumulation}"


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """The records of the run at one world size (hand-made ones make the unit tests)."""

    world_size: int
    """The number of processes ``multigpu verify`` asked for."""
    ranks: Sequence[Mapping[str, Any]]
    """Each rank's ``rank{r}.json``, in rank order (missing ranks left out)."""
    params: Mapping[str, torch.Tensor] = field(default_factory=dict)
    """Rank 0's parameters and buffers (``params.pt``); empty when no model was set up."""
    accumulation: int | None = None
    """The accumulation steps verify asked the script for (``--accumulation``), else None."""

    @property
    def label(self) -> str:
        """``world size N`` (``, accumulation K``)."""
        return run_label(self.world_size, self.accumulation)

    @property
    def main(self) -> Mapping[str, Any]:
        """Rank 0's record (the first one present)."""
        return self.ranks[0] if self.ranks else {}

    @property
    def steps(self) -> int:
        """Optimizer steps the run made (rank 0's count)."""
        return int(self.main.get("steps", 0))

    @property
    def recorded_world_size(self) -> int | None:
        """The world size the workers saw."""
        value = self.main.get("world_size")
        return int(value) if value is not None else None

    @property
    def loaders(self) -> list[Mapping[str, Any]]:
        """The loaders made with ``ctx.loader`` on rank 0, in order of creation."""
        return list(self.main.get("loaders", []))

    @property
    def dropout(self) -> list[str]:
        """Names of Dropout modules with p > 0 in the models (any rank)."""
        return list(dict.fromkeys(name for r in self.ranks for name in r.get("dropout", [])))

    @property
    def batchnorm(self) -> dict[str, bool]:
        """BatchNorm layers of the models (rank 0's record): name -> synchronized across ranks
        (SyncBatchNorm). Empty when none, or in a record that does not say."""
        return {str(k): bool(v) for k, v in dict(self.main.get("batchnorm") or {}).items()}

    @property
    def dtype(self) -> str | None:
        """The first parameter's dtype."""
        return self.main.get("dtype")

    @property
    def optimizers(self) -> list[str]:
        """Class names of the optimizers given to ``ctx.setup`` (rank 0)."""
        return list(self.main.get("optimizers", []))

    @property
    def adaptive(self) -> list[str]:
        """The optimizers among them that scale each gradient by its own history (Adam...)."""
        return [name for name in self.optimizers if name in ADAPTIVE_OPTIMIZERS]

    @property
    def precision(self) -> str | None:
        """``"32"``, ``"bf16-mixed"`` or ``"16-mixed"``."""
        return self.main.get("precision")

    @property
    def weighted_backward(self) -> int:
        """``ctx.backward`` calls with ``num_items`` (every rank's)."""
        return sum(int(r.get("weighted_backward", 0)) for r in self.ranks)

    @property
    def mean_over_ignored(self) -> dict[str, int]:
        """Every rank's ``ctx.backward`` calls without ``num_items`` whose loss is a
        cross-entropy mean over targets some of which are ignored: ``calls``, ``ignored`` and
        ``targets`` (all of theirs)."""
        total = {"calls": 0, "ignored": 0, "targets": 0}
        for r in self.ranks:
            counts = dict(r.get("mean_over_ignored") or {})
            for key in total:
                total[key] += int(counts.get(key, 0))
        return total

    @property
    def ignored_share(self) -> tuple[int, int] | None:
        """``(ignored, targets)`` in lowest terms when every one of those calls, on every rank,
        ignored the same share of its targets (transformers' one-token label shift: one target
        per sequence); None when the share varied (padding), or no call or record says.

        Example:
            >>> shift = {"calls": 2, "share": [1, 12], "varies": False}
            >>> RunRecord(world_size=2, ranks=[{"mean_over_ignored": shift}] * 2).ignored_share
            (1, 12)
        """
        shares = set()
        for r in self.ranks:
            counts = dict(r.get("mean_over_ignored") or {})
            if not counts.get("calls"):
                continue
            if counts.get("varies", True) or "share" not in counts:
                return None
            shares.add(tuple(int(n) for n in counts["share"]))
        if len(shares) != 1:
            return None
        (ignored, targets) = next(iter(shares))
        return ignored, targets

    @property
    def gradient_noise(self) -> dict[str, float]:
        """Per parameter, the largest ratio over the optimizer steps of its gradient's root mean
        square to that of all its optimizer's gradients (the largest any rank saw: every rank
        of a sharded model sees the whole norms, a pipeline stage only its own parameters);
        empty in a record that does not say."""
        ratios: dict[str, float] = {}
        for r in self.ranks:
            for name, ratio in dict(r.get("gradient_noise") or {}).items():
                ratios[name] = max(ratios.get(name, 0.0), float(ratio))
        return ratios

    @property
    def losses(self) -> list[float | None]:
        """The global loss of each optimizer step: the mean over ranks of each rank's loss.

        Every rank holds the same share of the global batch, so the mean of the ranks' means is
        the mean over the global batch. None for a step where some rank recorded no loss.

        Example:
            >>> r = RunRecord(world_size=2, ranks=[{"losses": [1.0, None]}, {"losses": [3.0, 1]}])
            >>> r.losses
            [2.0, None]
        """
        per_rank = [record.get("losses", []) for record in self.ranks]
        return [
            None if None in values else sum(map(float, values)) / len(values)
            for values in zip(*per_rank, strict=False)  # a rank that stopped early: common steps
        ]


def load_run(directory: Path, world_size: int, accumulation: int | None = None) -> RunRecord | None:
    """Read the records a run wrote in ``directory``; None when rank 0 wrote none."""
    ranks: list[Mapping[str, Any]] = []
    for rank in range(world_size):
        path = directory / RANK_FILE.format(rank=rank)
        if path.is_file():
            ranks.append(json.loads(path.read_text()))
    if not ranks or ranks[0].get("rank", 0) != 0:
        return None
    params_path = directory / PARAMS_FILE
    params: dict[str, torch.Tensor] = {}
    if params_path.is_file():
        # weights_only: the file is plain tensors; nothing else should be unpickled.
        params = torch.load(params_path, map_location="cpu", weights_only=True)
    log.debug("loaded %d rank record(s) and %d tensors from %s", len(ranks), len(params), directory)
    return RunRecord(world_size=world_size, ranks=ranks, params=params, accumulation=accumulation)

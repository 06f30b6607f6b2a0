"""Workers of test_no_side_effects (module level: spawned children import them)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as tdist

import multigpu
from multigpu.instruments.hang.install import active_log
from multigpu.runtime.collective_taps import TAPPED

NAMES = sorted(set(TAPPED) & set(dir(tdist)))


def _torch_functions() -> dict[str, Any]:
    found = {name: getattr(tdist, name) for name in NAMES}
    found["Work.wait"] = tdist.Work.wait
    return found


def traced_while_a_context_lives() -> dict[str, Any]:
    """torch.distributed's functions before, inside and after a Context (the tap the hang
    recorder and the wait clock listen to), and a metric computed where every rank reads the
    same data (a pipeline's processes) without any loader made."""
    before = _torch_functions()
    out: dict[str, Any] = {}
    with multigpu.init(strategy="pipeline", seed=0) as ctx:
        inside = _torch_functions()
        out["wrapped_inside"] = sorted(n for n in before if inside[n] is not before[n])
        out["log_inside"] = active_log() is not None
        mean = multigpu.Mean()
        mean.update(torch.tensor([1.0, 3.0]))  # the same two samples on both ranks
        out["mean"], out["count"] = mean.compute(), mean.count
        out["repeats"] = ctx.repeats_data
    after = _torch_functions()
    out["left_wrapped"] = sorted(n for n in before if after[n] is not before[n])
    out["log_after"] = active_log() is not None
    return out

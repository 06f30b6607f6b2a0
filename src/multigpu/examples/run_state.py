"""The digits job's own progress as a checkpointable object, and the files both jobs write.

``RunState`` is kept in the checkpoint beside the model, so a run killed at any step and resumed
(by hand or by ``multigpu run --max-restarts``) ends with the same per-epoch history — including
an epoch whose last step was saved just before the crash but whose evaluation had not run yet.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from multigpu.checkpoint import atomic_write


def _empty() -> dict[str, Any]:
    return {"loss_sum": 0.0, "micro": 0, "steps": 0, "seconds": 0.0, "samples": 0}


@dataclass
class RunState:
    """Per-epoch records plus the running sums of the epoch in progress.

    Example:
        >>> s = RunState(); s.add_step(0.5, stepped=True, seconds=0.1, samples=64)
        >>> t = RunState(); t.load_state_dict(s.state_dict())
        >>> s.current["micro"], t.current["steps"]
        (1, 1)
    """

    history: list[dict[str, Any]] = field(default_factory=list)
    train_seconds: float = 0.0
    train_samples: int = 0
    train_steps: int = 0
    current: dict[str, Any] = field(default_factory=_empty)

    def add_step(self, loss: float, *, stepped: bool, seconds: float, samples: int) -> None:
        """Count one micro-batch of the epoch in progress."""
        cur = self.current
        cur["loss_sum"] += loss
        cur["micro"] += 1
        cur["steps"] += int(stepped)
        cur["seconds"] += seconds
        cur["samples"] += samples if stepped else 0

    def close_epoch(self) -> dict[str, Any]:
        """Return the running sums of the finished epoch and start the next one."""
        done, self.current = self.current, _empty()
        self.train_seconds += done["seconds"]
        self.train_samples += done["samples"]
        self.train_steps += done["steps"]
        return done

    @property
    def steps(self) -> int:
        """Optimizer steps taken so far, over every epoch (the step trackers are sent)."""
        return self.train_steps + int(self.current["steps"])

    def state_dict(self) -> dict[str, Any]:
        """Everything, as plain Python values (loads with ``weights_only=True``)."""
        return asdict(self)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self.history = [dict(r) for r in state["history"]]
        self.train_seconds = float(state["train_seconds"])
        self.train_samples = int(state["train_samples"])
        self.train_steps = int(state.get("train_steps", 0))  # absent in older checkpoints
        self.current = dict(state["current"])


def parameter_sha256(state: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over the names and raw bytes of a state dict, in order.

    Two runs have bitwise-equal weights exactly when their checksums match, whatever the device.
    """
    digest = hashlib.sha256()
    for name, tensor in state.items():
        digest.update(name.encode())
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(str(flat.dtype).encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def write_outputs(
    state: Mapping[str, torch.Tensor],
    metrics: dict[str, Any],
    out: str | None,
    save: str | None = None,
) -> list[Path]:
    """Save ``state`` to ``save`` (default ``out/model.pt``), then ``metrics`` with its
    ``model_path`` to ``out/metrics.json``, each atomically; return the files written."""
    written: list[Path] = []
    target = Path(save) if save else (Path(out) / "model.pt" if out else None)
    if target is not None:
        written.append(atomic_write(target, lambda fh: torch.save(state, fh)))
        metrics["model_path"] = str(target)
    if out:
        text = json.dumps(metrics, indent=2) + "\n"
        written.append(atomic_write(Path(out) / "metrics.json", lambda fh: fh.write(text.encode())))
    return written

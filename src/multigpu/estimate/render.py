"""The estimate shown: a rich table (one row per strategy), plain text, or one JSON object."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from multigpu.estimate.capacity import GIB

WIDTH = 130
"""Columns the table needs without wrapping (wider terminals use their width)."""

FIGURES = ("parameters", "param_bytes", "world_size", "optimizer", "states_per_param", "precision")
"""The model's figures in the JSON, as ``MemoryEstimate`` names them."""
BYTES = ("params", "grads", "optimizer", "buffers", "total", "device", "host")
"""A strategy's bytes per rank, as ``StrategyMemory`` names them: the table's and JSON's columns."""

if TYPE_CHECKING:
    from rich.console import RenderableType

    from multigpu.estimate.memory import MemoryEstimate


def size(value: float) -> str:
    """Bytes as GiB, or MiB below a hundredth of a GiB.

    Example:
        >>> size(3 * 2**30), size(5 * 2**20), size(0)
        ('3.00 GiB', '5.0 MiB', '0 B')
    """
    if value == 0:
        return "0 B"
    return f"{value / GIB:.2f} GiB" if value >= GIB / 100 else f"{value / 2**20:.1f} MiB"


def _fit(estimate: MemoryEstimate, strategy: str) -> str:
    fits = estimate.fits(strategy)
    if fits is None:
        return "GPU only" if estimate.of(strategy).gpu_only else "-"
    share = 100 * estimate.of(strategy).device / max(1, estimate.room() or 1)
    return f"{'yes' if fits else 'no'} ({share:.0f}%)"


def summary(estimate: MemoryEstimate) -> str:
    """One line about the model: parameters, optimizer, precision, processes, FSDP units.

    Example:
        >>> import torch
        >>> from multigpu.estimate.memory import estimate_memory
        >>> with torch.device("meta"):
        ...     net = torch.nn.Linear(1000, 1000)
        >>> summary(estimate_memory(net, world_size=2))
        '1.00M parameters (3.8 MiB), adamw (2 states a parameter), precision 32, 2 processes, 1 FSDP unit (largest 0)'
    """  # noqa: E501
    units = len(estimate.units)
    return (
        f"{estimate.parameters / 1e6:.2f}M parameters ({size(estimate.param_bytes)}), "
        f"{estimate.optimizer} ({estimate.states_per_param} state"
        f"{'s' * (estimate.states_per_param != 1)} a parameter), precision {estimate.precision}, "
        f"{estimate.world_size} process{'es' * (estimate.world_size > 1)}, {units} FSDP unit"
        f"{'s' * (units > 1)} (largest {estimate.largest_unit / 1e6:.2f}M)"
    ).replace("(largest 0.00M)", "(largest 0)")


def rich_view(estimate: MemoryEstimate, *, header: str | None = None) -> RenderableType:
    """The estimate as rich renderables: a header (default ``summary``), the table, what one
    rank has, what ``strategy="auto"`` chooses, and what the figures leave out."""
    table = Table(title="memory per rank for the training state", title_justify="left")
    names = ["strategy", "params", "grads", "optimizer", "buffers", "total", "on device", "host"]
    for name in names + ["fits"] * (estimate.capacity is not None):
        table.add_column(name, justify="left" if name == "strategy" else "right", no_wrap=True)
    for row in estimate.strategies:
        cells = [row.strategy, *(size(getattr(row, name)) for name in BYTES)]
        if estimate.capacity is not None:
            cells.append(_fit(estimate, row.strategy))
        table.add_row(*cells)
    lines: list[RenderableType] = [Text(header or summary(estimate)), table]
    if estimate.capacity is not None:
        lines.append(Text(f"one rank has {size(estimate.room() or 0)}: {estimate.capacity.source}"))
        name, why = estimate.choose()
        lines.append(Text(f"strategy='auto' chooses {name}: {why}"))
    lines.extend(Text(note) for note in estimate.notes)
    return Group(*lines)


def as_text(estimate: MemoryEstimate, width: int = WIDTH) -> str:
    """``rich_view`` rendered to plain text (no colours)."""
    out = io.StringIO()
    Console(file=out, width=width, no_color=True, highlight=False).print(rich_view(estimate))
    return out.getvalue()


def as_json(estimate: MemoryEstimate) -> dict[str, Any]:
    """A JSON-ready dict: the model's figures, each strategy's bytes per rank, the fit."""
    out: dict[str, Any] = {name: getattr(estimate, name) for name in FIGURES}
    out |= {
        "units": len(estimate.units),
        "largest_unit": estimate.largest_unit,
        "strategies": {
            s.strategy: {name: getattr(s, name) for name in BYTES}
            | {"fits": estimate.fits(s.strategy)}
            for s in estimate.strategies
        },
        "capacity": None,
        "choice": None,
        "notes": list(estimate.notes),
    }
    if estimate.capacity is not None:
        out["capacity"] = {
            "bytes": estimate.room(),
            "source": estimate.capacity.source,
            "kind": estimate.capacity.kind,
        }
        name, why = estimate.choose()
        out["choice"] = {"strategy": name, "reason": why}
    return out

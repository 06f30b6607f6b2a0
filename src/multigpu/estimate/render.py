"""The estimate shown: a rich table (one row per strategy), plain text, or one JSON object."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from multigpu.estimate.choice import choose
from multigpu.estimate.figures import MemoryFigures, size

WIDTH = 130
"""Columns the table needs without wrapping (wider terminals use their width)."""

FIGURES = ("parameters", "param_bytes", "world_size", "optimizer", "states_per_param", "precision")
"""The model's figures in the JSON, as ``MemoryFigures`` names them."""
BYTES = ("params", "grads", "optimizer", "buffers", "total", "device", "host")
"""A strategy's bytes per rank, as ``StrategyMemory`` names them: the table's and JSON's columns."""

if TYPE_CHECKING:
    from rich.console import RenderableType


def _fit(estimate: MemoryFigures, strategy: str) -> str:
    fits = estimate.fits(strategy)
    if fits is None:
        return "GPU only" if estimate.of(strategy).gpu_only else "-"
    share = 100 * estimate.of(strategy).device / max(1, estimate.room() or 1)
    return f"{'yes' if fits else 'no'} ({share:.0f}%)"


def summary(estimate: MemoryFigures) -> str:
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


def count(n: int) -> str:
    """A number of parameters, short.

    Example:
        >>> count(512), count(198_272), count(6_738_415_616)
        ('512', '198.3k', '6.74B')
    """
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.{1 if suffix == 'k' else 2}f}{suffix}"
    return str(n)


def units_line(estimate: MemoryFigures) -> str:
    """FSDP's units and their parameters in one line; a run of same-sized units named alike
    (a model's blocks) is shown as its first and last.

    Example:
        >>> import torch
        >>> from multigpu.estimate.memory import estimate_memory
        >>> with torch.device("meta"):
        ...     net = torch.nn.Sequential(*(torch.nn.Linear(400, 400) for _ in range(6)))
        >>> units_line(estimate_memory(net, world_size=2))
        'FSDP units (repeated: Linear): 0 … 5 (6 × 160.4k), <root> (0) parameters'
    """
    runs: list[list[tuple[str, int]]] = []
    for name, params in estimate.units:
        last = runs[-1][-1] if runs else None
        if last is not None and last[1] == params and _alike(last[0], name):
            runs[-1].append((name, params))
        else:
            runs.append([(name, params)])
    parts = []
    for run in runs:
        if len(run) >= 3:
            parts.append(f"{run[0][0]} … {run[-1][0]} ({len(run)} × {count(run[0][1])})")
        else:
            parts.extend(f"{name or '<root>'} ({count(params)})" for name, params in run)
    return f"FSDP units ({estimate.unit_rule}): {', '.join(parts)} parameters"


def _alike(a: str, b: str) -> bool:
    """Whether two unit names differ only in their last dotted part, a number (``h.3``)."""
    (pa, _, na), (pb, _, nb) = a.rpartition("."), b.rpartition(".")
    return pa == pb and na.isdigit() and nb.isdigit()


def rich_view(estimate: MemoryFigures, *, header: str | None = None) -> RenderableType:
    """The estimate as rich renderables: a header (default ``summary``), FSDP's units (and a
    warning when one holds most of the model), the table, what one rank has, what
    ``strategy="auto"`` chooses, and what the figures leave out."""
    table = Table(title="memory per rank for the training state", title_justify="left")
    names = ["strategy", "params", "grads", "optimizer", "buffers", "total", "on device", "host"]
    for name in names + ["fits"] * (estimate.capacity is not None):
        table.add_column(name, justify="left" if name == "strategy" else "right", no_wrap=True)
    for row in estimate.strategies:
        cells = [row.strategy, *(size(getattr(row, name)) for name in BYTES)]
        if estimate.capacity is not None:
            cells.append(_fit(estimate, row.strategy))
        table.add_row(*cells)
    lines: list[RenderableType] = [Text(header or summary(estimate)), Text(units_line(estimate))]
    if estimate.unit_warning:
        lines.append(Text(f"warning: {estimate.unit_warning}"))
    lines.append(table)
    if estimate.capacity is not None:
        lines.append(Text(f"one rank has {size(estimate.room() or 0)}: {estimate.capacity.source}"))
        name, why = choose(estimate, estimate.capacity)
        lines.append(Text(f"strategy='auto' chooses {name}: {why}"))
    lines.extend(Text(note) for note in estimate.notes)
    return Group(*lines)


def as_text(estimate: MemoryFigures, width: int = WIDTH) -> str:
    """``rich_view`` rendered to plain text (no colours)."""
    out = io.StringIO()
    Console(file=out, width=width, no_color=True, highlight=False).print(rich_view(estimate))
    return out.getvalue()


def as_json(estimate: MemoryFigures) -> dict[str, Any]:
    """A JSON-ready dict: the model's figures, each strategy's bytes per rank, the fit."""
    out: dict[str, Any] = {name: getattr(estimate, name) for name in FIGURES}
    out |= {
        "units": len(estimate.units),
        "largest_unit": estimate.largest_unit,
        "fsdp_units": [
            {"name": name or "<root>", "parameters": params} for name, params in estimate.units
        ],
        "fsdp_unit_rule": estimate.unit_rule,
        "fsdp_unit_warning": estimate.unit_warning,
        "strategies": {
            s.strategy: {name: getattr(s, name) for name in BYTES}
            | {"resume": s.resume, "fits": estimate.fits(s.strategy)}
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
        name, why = choose(estimate, estimate.capacity)
        out["choice"] = {"strategy": name, "reason": why}
    return out

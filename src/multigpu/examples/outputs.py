"""What the built-in jobs write beside ``metrics.json``, and the lines that end a run naming it.

``loss.png``: the run's loss curve, drawn by matplotlib (the ``plot`` extra) on its headless Agg
canvas (no display, no pyplot state), written atomically; without matplotlib it is skipped
silently. ``written_lines``: where the model, the metrics, the plot and the checkpoints went, in
a few lines, for rank 0 to print last.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from multigpu.checkpoint import atomic_write, list_checkpoints
from multigpu.examples.run_state import write_outputs

PLOT_FILE = "loss.png"
"""The loss curve's file name, in the output directory beside ``metrics.json``."""


def plot_loss(
    path: str | os.PathLike[str],
    x: Sequence[float],
    curves: Mapping[str, Sequence[float | None]],
    *,
    xlabel: str,
    ylabel: str,
    title: str,
) -> Path | None:
    """Draw ``curves`` (label: one value per ``x``; None: no point there) to the PNG ``path``.

    Returns the path, or None when matplotlib is not installed (nothing is written then).
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    figure = Figure(figsize=(6.4, 4.0), dpi=100)
    FigureCanvasAgg(figure)  # the headless canvas: no display, no global pyplot state
    axes = figure.add_subplot()
    for label, values in curves.items():
        points = [(a, b) for a, b in zip(x, values, strict=True) if b is not None]
        if points:
            xs, ys = zip(*points, strict=True)
            axes.plot(xs, ys, marker="o" if len(points) < 30 else None, label=label)
    axes.set(xlabel=xlabel, ylabel=ylabel, title=title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    return atomic_write(path, lambda fh: figure.savefig(fh, format="png"))


def written_lines(
    files: Sequence[Path], checkpoint_dir: str | os.PathLike[str] | None
) -> list[str]:
    """The lines that end a run: the files it wrote (grouped by directory) and its complete
    checkpoints, the newest with the command that inspects it.

    Example:
        >>> written_lines([Path("runs/lm/1/model.pt"), Path("runs/lm/1/metrics.json")], None)
        ['wrote runs/lm/1/: model.pt, metrics.json']
    """
    by_dir: dict[Path, list[str]] = {}
    for file in files:
        by_dir.setdefault(file.parent, []).append(file.name)
    lines = [f"wrote {d}{os.sep}: {', '.join(names)}" for d, names in by_dir.items()]
    steps = (
        [s.path for s in list_checkpoints(checkpoint_dir, checksums=False) if s.complete]
        if checkpoint_dir is not None
        else []
    )
    if steps:
        names = ", ".join(p.name for p in steps)
        lines.append(
            f"checkpoints in {checkpoint_dir}{os.sep}: {names} (multigpu ckpt inspect {steps[-1]})"
        )
    if not lines:
        lines.append("wrote nothing: give --out DIR to keep the model, metrics and checkpoints")
    return lines


def finish(
    ctx: Any,
    state: Mapping[str, Any],
    metrics: dict[str, Any],
    args: Any,
    *,
    checkpointer: Any = None,
    plot: Callable[[Path], Path | None] | None = None,
) -> list[str]:
    """On rank 0: write ``model.pt`` (or ``--save``), ``metrics.json`` and, with ``plot``
    (drawing to the path it is given), ``loss.png`` to ``--out``; return the lines that name
    them and the checkpoints. Other ranks write nothing and get no lines."""
    if not ctx.is_main:
        return []
    files = write_outputs(state, metrics, args.out, getattr(args, "save", None))
    if args.out and plot is not None:
        png = plot(Path(args.out) / PLOT_FILE)
        if png is not None:
            files.append(png)
    return written_lines(files, checkpointer.directory if checkpointer is not None else None)


def plot_digits(history: Sequence[Mapping[str, Any]]) -> Callable[[Path], Path | None]:
    """The digits job's curve: the training loss of each epoch."""
    return lambda path: plot_loss(
        path,
        [r["epoch"] for r in history],
        {"training loss": [r["loss"] for r in history]},
        xlabel="epoch",
        ylabel="cross-entropy",
        title="multigpu train: digits",
    )


def plot_lm(history: Sequence[Mapping[str, Any]], baseline: float) -> Callable[[Path], Path | None]:
    """The LM's curves at each evaluation: training and validation loss, and the unigram
    baseline they are measured against."""
    return lambda path: plot_loss(
        path,
        [r["step"] for r in history],
        {
            "training loss": [r["train_loss"] for r in history],
            "validation loss": [r["val_loss"] for r in history],
            "unigram baseline": [baseline] * len(history),
        },
        xlabel="optimizer step",
        ylabel="nats per byte",
        title="multigpu train --model lm",
    )

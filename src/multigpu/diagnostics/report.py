"""How ``multigpu verify`` shows its result: a rich table and lines, or one JSON object."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from multigpu.diagnostics.compare import RunComparison, TensorDiff, Tolerance, noise_floor
from multigpu.diagnostics.records import run_label

MAX_ROWS = 40
"""Tensors shown in the table: the failing ones and the worst, the rest counted."""

MAX_NAMED = 8
"""Tensors named on the line of those judged at noise level, the rest counted."""


@dataclass(frozen=True, kw_only=True)
class RunOutcome:
    """How the run at one world size went."""

    world_size: int
    returncode: int
    seconds: float
    command: tuple[str, ...]
    stderr_tail: str = ""
    """The last lines of its stderr (shown when it failed)."""
    error: str = ""
    """Why it failed, in one line: the launcher's (``rank R on HOST failed: Type: message``)
    or the last exception line of its stderr; empty when it did not fail or nothing says."""
    accumulation: int | None = None
    """The accumulation steps asked of the script (``--accumulation``), else None."""

    @property
    def label(self) -> str:
        return run_label(self.world_size, self.accumulation)


@dataclass(frozen=True, kw_only=True)
class VerifyResult:
    """Everything ``multigpu verify`` found."""

    world_sizes: tuple[int, ...]
    device: str
    """``"cpu"`` (gloo processes) or ``"cuda"`` (one GPU per process)."""
    steps_requested: int
    tolerance: Tolerance
    deterministic: bool
    runs: tuple[RunOutcome, ...]
    accumulation: tuple[int, ...] | None = None
    """The accumulation steps every world size ran at (``--accumulation``), else None."""
    comparisons: tuple[RunComparison, ...] = ()
    reasons: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    directory: str | None = None
    """Where the runs were kept (``--keep``), else None."""
    gradient_dtype: str = "float32"
    """The dtype the reference computed its gradients in: the root of its epsilon is the noise
    floor of a gradient (``compare.noise_floor``)."""

    @property
    def noise_floor(self) -> float:
        return noise_floor(self.gradient_dtype, None)

    @property
    def noise_level(self) -> tuple[str, ...]:
        """The tensors judged at noise level in any comparison, in order."""
        return tuple(dict.fromkeys(name for c in self.comparisons for name in c.noise_level))

    @property
    def passed(self) -> bool:
        return (
            all(r.returncode == 0 for r in self.runs)
            and len(self.runs) == self.expected_runs
            and len(self.comparisons) == self.expected_runs - 1
            and all(c.ok for c in self.comparisons)
        )

    @property
    def expected_runs(self) -> int:
        """Every world size, at every accumulation asked for."""
        return len(self.world_sizes) * len(self.accumulation or (None,))

    @property
    def verdict(self) -> str:
        return "PASS" if self.passed else "FAIL"


def _num(value: float) -> float | None:
    # JSON has no NaN or infinity: null means "not comparable" (see "problem").
    return value if math.isfinite(value) else None


def to_json(result: VerifyResult) -> dict[str, Any]:
    """The ``--json`` object: world sizes, per-tensor diffs, steps, losses, reasons, verdict."""
    return {
        "verdict": result.verdict,
        "world_sizes": list(result.world_sizes),
        **({"accumulation": list(result.accumulation)} if result.accumulation else {}),
        "device": result.device,
        "steps_requested": result.steps_requested,
        "rtol": result.tolerance.rtol,
        "atol": result.tolerance.atol,
        "l2_rtol": result.tolerance.l2_rtol,
        "deterministic": result.deterministic,
        "gradient_dtype": result.gradient_dtype,
        "noise_floor": result.noise_floor,
        "noise_level": list(result.noise_level),
        "runs": [
            {
                "world_size": run.world_size,
                "returncode": run.returncode,
                "seconds": round(run.seconds, 2),
                "command": list(run.command),
                **({"accumulation": run.accumulation} if run.accumulation is not None else {}),
                **({"error": run.error, "stderr_tail": run.stderr_tail} if run.returncode else {}),
            }
            for run in result.runs
        ],
        "comparisons": [_comparison_json(c) for c in result.comparisons],
        "reasons": list(result.reasons),
        "notes": list(result.notes),
        "directory": result.directory,
    }


def _comparison_json(c: RunComparison) -> dict[str, Any]:
    return {
        "world_size": c.world_size,
        "reference_world_size": c.reference_world_size,
        **(
            {"accumulation": c.accumulation, "reference_accumulation": c.reference_accumulation}
            if c.accumulation is not None
            else {}
        ),
        "ok": c.ok,
        "steps": c.steps,
        "reference_steps": c.reference_steps,
        "max_abs_diff": _num(c.max_abs),
        "max_rel_diff": _num(c.max_rel),
        "l2_rel_diff": _num(c.l2_rel),
        "noise_level": list(c.noise_level),
        "losses": {
            "compared": c.losses.compared,
            "max_abs_diff": _num(c.losses.max_abs),
            "max_rel_diff": _num(c.losses.max_rel),
            "first_differing_step": c.losses.first_step,
            "first_differing_values": list(c.losses.first_values or []) or None,
        },
        "tensors": [
            {
                "name": t.name,
                "shape": list(t.shape),
                "max_abs_diff": _num(t.max_abs),
                "max_rel_diff": _num(t.max_rel),
                "l2_rel_diff": _num(t.l2_rel),
                "ok": t.ok,
                **({"noise_level": True} if t.noise else {}),
                **({"problem": t.problem} if t.problem else {}),
            }
            for t in c.tensors
        ],
    }


def noise_line(result: VerifyResult) -> str:
    """The one line that names the tensors judged at noise level, and why."""
    names = result.noise_level
    shown = ", ".join(names[:MAX_NAMED])
    if len(names) > MAX_NAMED:
        shown += f" and {len(names) - MAX_NAMED} more (--json lists them all)"
    worst = max((t.max_rel for c in result.comparisons for t in c.tensors if t.noise), default=0.0)
    return (
        f"judged at noise level: {len(names)} tensor{'s' * (len(names) != 1)} ({shown}): at "
        "every step of both runs their gradient's root mean square was at most "
        f"{result.noise_floor:.1e} (the square root of {result.gradient_dtype}'s epsilon) of "
        "their module's gradients', zero but for rounding (an attention key's bias beside its "
        "weight: softmax ignores it), so their values are rounding noise and their differences "
        f"(up to {worst:.2e} of their largest value) are not held against the run"
    )


def _cell(value: float) -> str:
    return "-" if math.isinf(value) else f"{value:.2e}"


def _short(c: RunComparison) -> str:
    return run_label(c.world_size, c.accumulation, short=True)


def _rows(
    comparisons: Sequence[RunComparison],
) -> tuple[list[tuple[str, dict[str, TensorDiff]]], int]:
    """The tensors to show by name (failing ones, then the worst), and how many are left out."""
    rows: dict[str, dict[str, TensorDiff]] = {}
    for c in comparisons:  # by name: a tensor missing in one run does not shift the others
        for t in c.tensors:
            rows.setdefault(t.name, {})[_short(c)] = t

    def badness(name: str) -> tuple[bool, float]:
        ts = list(rows[name].values())
        return (any(not t.ok for t in ts), max(t.max_rel for t in ts))

    keep = set(sorted(rows, key=badness, reverse=True)[:MAX_ROWS])
    names = [name for name in rows if name in keep]
    return [(name, rows[name]) for name in names], len(rows) - len(names)


def render(result: VerifyResult, console: Console) -> None:
    """Print the table, the steps and losses, the reasons and the final PASS/FAIL line."""
    comparisons = result.comparisons
    if comparisons and comparisons[0].tensors:
        console.print(_table(comparisons, result.tolerance))
    for c in comparisons:
        console.print(_steps_line(c) + "; " + _loss_line(c), highlight=False)
    tol = result.tolerance
    judged = f", tensors by L2: l2_rtol {tol.l2_rtol:g}" if tol.l2_rtol is not None else ""
    console.print(f"tolerance: rtol {tol.rtol:g}, atol {tol.atol:g}{judged}", highlight=False)
    if result.noise_level:
        console.print(noise_line(result), markup=False, highlight=False)
    for run in result.runs:
        if run.returncode:
            console.print(
                f"[red]the run at {run.label} failed[/] (exit code {run.returncode}); its "
                "stderr ends with:",
                highlight=False,
            )
            console.print(run.stderr_tail, markup=False, highlight=False)
    for note in result.notes:
        console.print(f"note: {note}", markup=False, highlight=False)
    for reason in result.reasons:
        console.print(f"reason: {reason}", markup=False, highlight=False)
    colour = "green" if result.passed else "red"
    console.print(f"[bold {colour}]{result.verdict}[/]", highlight=False)


def _table(comparisons: Sequence[RunComparison], tol: Tolerance) -> Table:
    """Per tensor and run: max abs, max rel and L2 rel difference and the verdict; beyond two
    runs compared (``--accumulation``), only the difference it is judged by, to stay readable."""
    compact = len(comparisons) > 2
    judged = "L2 rel diff" if tol.l2_rtol is not None else "max rel diff"
    table = Table(title=f"parameters and buffers against {comparisons[0].reference_label}")
    table.add_column("parameter", overflow="fold")
    table.add_column("shape")
    for c in comparisons:
        for what in [judged] if compact else ["max abs diff", "max rel diff", "L2 rel diff"]:
            table.add_column(f"{what} ({_short(c)})", justify="right")
        table.add_column(f"ws {_short(c)}")
    shown, hidden = _rows(comparisons)
    for name, diffs in shown:
        shape = next(iter(diffs.values())).shape
        cells = [name, "×".join(map(str, shape)) or "scalar"]
        for c in comparisons:
            t = diffs.get(_short(c))
            if t is None:
                cells += ["-"] * (1 if compact else 3) + ["[red]FAIL[/] missing"]
                continue
            if compact:
                cells.append(_cell(t.l2_rel if tol.l2_rtol is not None else t.max_rel))
            else:
                cells += [_cell(t.max_abs), _cell(t.max_rel), _cell(t.l2_rel)]
            if t.noise:
                cells.append("[yellow]noise[/]")
            else:
                cells.append("[green]OK[/]" if t.ok else f"[red]FAIL[/] {t.problem}".rstrip())
        table.add_row(*cells)
    if hidden:
        table.caption = f"{hidden} more tensors within tolerance not shown (--json lists all)"
    return table


def _steps_line(c: RunComparison) -> str:
    same = "same" if c.steps == c.reference_steps else "[red]DIFFERENT[/]"
    if c.accumulation is None:
        against = f"world size {c.world_size} vs {c.reference_world_size}"
    else:
        against = f"{c.label} vs {c.reference_label}"
    return f"{against}: optimizer steps {c.steps} vs {c.reference_steps} ({same})"


def _loss_line(c: RunComparison) -> str:
    losses = c.losses
    if not losses.compared:
        return "losses: none recorded"
    text = f"losses: {losses.compared} compared, max rel diff {_cell(losses.max_rel)}"
    if losses.first_step is None:
        return text + ", all within tolerance"
    a, b = losses.first_values or (math.nan, math.nan)
    return text + f", [red]first differs at step {losses.first_step}[/] ({a:.6g} vs {b:.6g})"

"""What ``init(compile=)`` says on rank 0, once: the compile time and the graph breaks.

``torch.compile`` compiles lazily, at a block's first forward (and AOT autograd its backward at
the first backward), so the report waits for the first optimizer step (``on_step``), or the
teardown of a run that never called ``ctx.step``. Two lines::

    torch.compile: compiled 4 blocks in 3.1 s (Block; backend aot_eager)
    torch.compile: no graph breaks

The figures are this process's since ``init`` (``torch_compat.compile_seconds`` and
``graph_breaks``): rank 0's, which every rank repeats for the same model.
"""

from __future__ import annotations

from typing import Any

from multigpu.instruments.hooks import Hook
from multigpu.strategies.auto import in_use
from multigpu.torch_compat import compile_seconds, graph_breaks


class CompileReport(Hook):
    """Prints the compile line and the graph-break line on rank 0, once."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self._seconds = compile_seconds()  # what the process had compiled before this run
        self._breaks = graph_breaks()
        self._said = False

    def on_step(self, ctx: Any) -> None:
        self._report(ctx)

    def on_teardown(self, ctx: Any) -> None:
        self._report(ctx)

    def lines(self, strategy: Any) -> list[str]:
        """The two lines for ``strategy`` (what it compiled), with the figures of now."""
        composed = in_use(strategy).composed
        what = composed.describe() if composed is not None else "nothing"
        detail = composed.detail() if composed is not None else "no ctx.setup"
        seconds = compile_seconds() - self._seconds
        breaks = {
            reason: count - self._breaks.get(reason, 0)
            for reason, count in graph_breaks().items()
            if count > self._breaks.get(reason, 0)
        }
        compiled = (
            f"torch.compile: compiled {what} in {seconds:.1f} s ({detail}; backend {self.backend})"
        )
        if not breaks:
            return [compiled, "torch.compile: no graph breaks"]
        first = " ".join(next(iter(breaks)).split())  # one line, whatever the reason's shape
        total = sum(breaks.values())
        breaks_said = f"{total} graph break{'s' if total > 1 else ''}"
        return [compiled, f"torch.compile: {breaks_said} (first: {first[:200]})"]

    def _report(self, ctx: Any) -> None:
        if self._said:
            return
        self._said = True
        if ctx.rank == 0:
            for line in self.lines(ctx.strategy):
                ctx.print(line)

"""``torch.compile``'s private counters and the partitioner's memory budget (see
``multigpu.torch_compat``).

- **Compile time**: ``torch._dynamo.utils.calculate_time_spent()["total_wall_time"]``: seconds
  dynamo spent compiling frames and AOT autograd compiling their backwards, summed over the
  process (``compile_seconds``).
- **Graph breaks**: ``torch._dynamo.utils.counters["graph_break"]``: a Counter of reason ->
  count over the process (``graph_breaks``), and ``counters["unimplemented"]``'s "Dynamo
  recompile limit exceeded": a frame compiled more than ``recompile_limit`` (8) times runs
  eagerly from then on (``module.compile()`` of many block classes in one process reaches it).
- **Memory budget**: ``torch._functorch.config.activation_memory_budget`` (1.0 by default):
  the share of a compiled region's activations the min-cut partitioner keeps for the backward;
  it recomputes the rest (``activation_memory_budget`` sets it for the time of a block).
  ``backend_with_memory_budget`` sets it only while a backend compiles (where the partitioner
  runs), through a backend of its own: dynamo keeps a compiled graph per backend, so a block
  compiled earlier in the process without the budget is compiled again with it, not reused
  (the budget itself is no guard). Backends by name: ``torch._dynamo.backends.registry
  .lookup_backend``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any


def compile_seconds() -> float:
    """Seconds this process has spent in ``torch.compile`` so far (forward and backward)."""
    from torch._dynamo.utils import calculate_time_spent

    return float(calculate_time_spent().get("total_wall_time", 0.0))


def graph_breaks() -> dict[str, int]:
    """``{reason: count}`` of the graph breaks ``torch.compile`` has met in this process, and of
    the frames it gave up on at its recompile limit (they run eagerly from then on)."""
    from torch._dynamo.utils import counters

    found = dict(counters["graph_break"])
    for reason, count in counters["unimplemented"].items():
        if "recompile limit" in reason.lower():  # the first line says which limit
            found[reason.splitlines()[0]] = count
    return found


@contextlib.contextmanager
def activation_memory_budget(budget: float) -> Iterator[None]:
    """Within the block, compiled regions keep ``budget`` of their activations (0 < budget < 1);
    the previous value is restored after it."""
    import torch._functorch.config as functorch_config

    previous = functorch_config.activation_memory_budget
    functorch_config.activation_memory_budget = budget
    try:
        yield
    finally:
        functorch_config.activation_memory_budget = previous


def current_memory_budget() -> float:
    """The partitioner's memory budget now (1.0: keep what runs fastest)."""
    import torch._functorch.config as functorch_config

    return float(functorch_config.activation_memory_budget)


_BUDGETED: dict[tuple[str, float], Callable[..., Any]] = {}


def backend_with_memory_budget(backend: str, budget: float) -> Callable[..., Any]:
    """The ``torch.compile`` backend ``backend`` compiling under the memory budget ``budget``;
    one object per (backend, budget), so that repeated blocks share their compiled graph."""
    made = _BUDGETED.get((backend, budget))
    if made is not None:
        return made
    from torch._dynamo.backends.registry import lookup_backend

    inner = lookup_backend(backend)

    def compile_within_budget(graph: Any, example_inputs: Any, **kwargs: Any) -> Any:
        with activation_memory_budget(budget):
            return inner(graph, example_inputs, **kwargs)

    compile_within_budget.__name__ = f"{backend}_budget_{budget:g}"
    _BUDGETED[backend, budget] = compile_within_budget
    return compile_within_budget

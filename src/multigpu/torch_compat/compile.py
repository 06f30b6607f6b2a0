"""``torch.compile``'s private counters and the partitioner's memory budget (see
``multigpu.torch_compat``).

- **Compile time**: ``torch._dynamo.utils.calculate_time_spent()["total_wall_time"]``: seconds
  dynamo spent compiling frames and AOT autograd compiling their backwards, summed over the
  process (``compile_seconds``).
- **Graph breaks**: ``torch._dynamo.utils.counters["graph_break"]``: a Counter of reason ->
  count over the process (``graph_breaks``).
- **Memory budget**: ``torch._functorch.config.activation_memory_budget`` (1.0 by default):
  the share of a compiled region's activations the min-cut partitioner keeps for the backward;
  it recomputes the rest (``activation_memory_budget`` sets it for the time of a block).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


def compile_seconds() -> float:
    """Seconds this process has spent in ``torch.compile`` so far (forward and backward)."""
    from torch._dynamo.utils import calculate_time_spent

    return float(calculate_time_spent().get("total_wall_time", 0.0))


def graph_breaks() -> dict[str, int]:
    """``{reason: count}`` of the graph breaks ``torch.compile`` has met in this process."""
    from torch._dynamo.utils import counters

    return dict(counters["graph_break"])


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

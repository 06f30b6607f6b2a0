"""The numbers torchrun takes, checked before anything starts.

torch's agent checks some of them with ``assert`` deep inside the launch (``--max-restarts -1``
ended in "AssertionError: max_restarts must be >= 0", exit 1; ``--monitor-interval -1`` in a
bare "AssertionError") and others not at all (``--master-port 70000`` failed at the first
bind). Each is refused here with one line and exit code 2, before the workers start.
"""

from __future__ import annotations

from dataclasses import dataclass

from multigpu.errors import UsageError
from multigpu.launch.options import LaunchOptions


@dataclass(frozen=True)
class _Bound:
    option: str
    low: float
    high: float | None
    meaning: str
    example: str


_BOUNDS = {
    "max_restarts": _Bound("--max-restarts", 0, None, "a number of restarts, >= 0",
                           "--max-restarts 3"),
    "monitor_interval": _Bound("--monitor-interval", 1e-9, None,
                               "seconds between checks of the workers, > 0",
                               "--monitor-interval 0.1"),
    "node_rank": _Bound("--node-rank", 0, None, "this node's index, >= 0",
                        "--node-rank 1"),
    "master_port": _Bound("--master-port", 1, 65535, "a TCP port, 1 to 65535",
                          "--master-port 29500"),
    "shutdown_timeout": _Bound("--shutdown-timeout", 0, None,
                               "seconds the workers get to stop before SIGKILL, >= 0",
                               "--shutdown-timeout 15"),
}  # fmt: skip


def check_torchrun_numbers(options: LaunchOptions) -> None:
    """Raise UsageError for a torchrun number out of its range (``--nproc-per-node`` and
    ``--nnodes`` are checked where the plan reads them).

    Example:
        >>> check_torchrun_numbers(LaunchOptions(script="t.py", torchrun={"max_restarts": -1}))
        Traceback (most recent call last):
        ...
        multigpu.errors.UsageError: --max-restarts -1 is out of range: expected a number of \
restarts, >= 0; e.g. --max-restarts 3
    """
    for dest, bound in _BOUNDS.items():
        value = options.get(dest)
        if value is None:
            continue
        number = float(value)  # argparse gave an int or a float
        if number < bound.low or (bound.high is not None and number > bound.high):
            raise UsageError(
                f"{bound.option} {value:g} is out of range: expected {bound.meaning}; "
                f"e.g. {bound.example}"
            )

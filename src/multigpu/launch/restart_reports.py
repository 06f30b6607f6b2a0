"""What the elastic agent does between a failure and the resumed training, said as it happens.

torch's agent logs a restart at INFO (hidden by default) and then says nothing while it stops the
workers, waits in the rendezvous for the nodes and starts new workers: 18-21 s in which a user
saw a run that looked hung. ``RestartReports`` is mixed into multigpu's agent and prints one line
for each event on the launcher's stderr:

- a worker failed and the group restarts: who failed, how, and restart k of K;
- nodes wait to join (a membership change, which torch does not count as a restart);
- each rendezvous round after the first: how many nodes and workers the run has now, and that
  the workers resume from the newest complete checkpoint (under ``--replicas``: heal from a live
  replica group; environment variable read: ``MULTIGPU_REPLICA_GROUPS``).

``RestartReports`` overrides two methods of torch's ``SimpleElasticAgent`` (``_monitor_workers``,
``_restart_workers``), each calling torch's own: a canary test in
``tests/core/test_torch_compat.py`` fails when torch changes them. The rounds are said by
``RoundReports``, called from the rendezvous handler (``launch/rendezvous.py``): no override.
"""

from __future__ import annotations

import os
from typing import Any

from multigpu.launch.failure_summary import failures_of, say, summary_line


class RestartReports:
    """Mixin for a ``torch.distributed.elastic`` agent (listed before the agent class)."""

    _last_result: Any = None

    def _monitor_workers(self, worker_group: Any) -> Any:
        result = super()._monitor_workers(worker_group)  # type: ignore[misc]
        self._last_result = result
        return result

    def _restart_workers(self, worker_group: Any) -> None:
        say(self._restart_line(worker_group))
        super()._restart_workers(worker_group)  # type: ignore[misc]

    def _restart_line(self, worker_group: Any) -> str:
        spec = worker_group.spec
        result = self._last_result
        failed = getattr(result, "failures", None)
        if failed:
            done = spec.max_restarts - self._remaining_restarts  # type: ignore[attr-defined]
            cause = summary_line(failures_of(result), log_hint="its output is above")
            return f"{cause}; restarting the workers (restart {done} of {spec.max_restarts})"
        waiting = spec.rdzv_handler.num_nodes_waiting()
        return (
            f"{waiting} node(s) waiting to join; restarting the workers to admit them "
            "(a membership change: not counted as a restart)"
        )


class RoundReports:
    """Says each rendezvous round after the first: its nodes and world size, and what the
    workers do next."""

    def __init__(self) -> None:
        self.rounds = 0
        self.world_size: int | None = None

    def report(self, nodes: int, world: int) -> None:
        """A round ended with ``nodes`` nodes and ``world`` workers in all."""
        self.rounds += 1
        if self.rounds > 1:
            was = f" (was {self.world_size})" if world != self.world_size else ""
            # A replica group's workers heal from a live group (multigpu run --replicas).
            resume = (
                "heal from a live replica group (or, with none left, resume from the newest "
                "complete checkpoint)"
                if os.environ.get("MULTIGPU_REPLICA_GROUPS")
                else "resume from the newest complete checkpoint"
            )
            say(
                f"rendezvous round {self.rounds}: {nodes} node(s), world size {world}{was}; "
                f"the workers start again and {resume}"
            )
        self.world_size = world

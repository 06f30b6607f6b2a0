"""What the elastic agent does between a failure and the resumed training, said as it happens.

torch's agent logs a restart at INFO (hidden by default) and then says nothing while it stops the
workers, waits in the rendezvous for the nodes and starts new workers: 18-21 s in which a user
saw a run that looked hung. ``RestartReports`` and ``RoundReports`` print one line for each event
on the launcher's stderr:

- a worker failed and the group restarts: who failed, how, and restart k of K;
- nodes wait to join (a membership change, which torch does not count as a restart);
- each rendezvous round after the first: how many nodes and workers the run has now, and that
  the workers resume from the newest complete checkpoint (under ``--replicas``: heal from a live
  replica group; environment variable read: ``MULTIGPU_REPLICA_GROUPS``).

The agent (``launch/agent/``) calls ``RestartReports.failed`` from its override of torch's
``_monitor_workers`` when torch's loop will restart (canary in
``tests/core/test_torch_compat.py``); the rendezvous handler's public ``num_nodes_waiting`` and
``next_rendezvous`` (``launch/agent/rendezvous.py``) call ``RestartReports.admitting`` and
``RoundReports``.
"""

from __future__ import annotations

import os
from typing import Any

from multigpu.launch.failure_summary import failures_of, say, summary_line


class RestartReports:
    """Says why the agent restarts its workers: ``launch/agent/`` hands it each failed check
    that torch's agent answers with a restart (``failed``), and ``launch/agent/rendezvous.py`` the
    nodes waiting to join (``admitting``), for which the agent restarts its healthy workers."""

    def failed(self, worker_group: Any, result: Any, remaining_restarts: int) -> None:
        """The workers failed (``result``) and the agent restarts them, with
        ``remaining_restarts`` left after this restart."""
        spec = worker_group.spec
        done = spec.max_restarts - remaining_restarts
        cause = summary_line(failures_of(result), log_hint="its output is above")
        say(f"{cause}; restarting the workers (restart {done} of {spec.max_restarts})")

    def admitting(self, waiting: int) -> None:
        """``waiting`` nodes wait to join: the agent restarts its workers to admit them."""
        say(
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

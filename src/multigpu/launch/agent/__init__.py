"""The elastic agent ``multigpu run`` hands to ``torch.distributed.run``: torchrun's, plus seven.

- Its exit barrier (the wait for the other nodes' workers at the end) is bounded by
  ``--timeout``: ``torch.distributed.run`` gives no option for it (300 s).
- Its TCP connections to the rendezvous store fail after ``--timeout`` + 5 s when the store's
  host vanishes, instead of ~15 minutes deaf to SIGTERM (``timeouts.store_call_bound``).
- Before it dials another node's rendezvous store, it waits for the store to answer within
  ``--timeout`` (``multigpu.common.store_reach``): torch's client retried with back-off past it
  (37-68 s for 30 s) and then said nothing of what it waited for.
- After each rendezvous round, before its workers start, it checks with the other nodes that
  they were started alike (``start_agreement.check_nodes_agree``, called from the
  rendezvous handler's public ``next_rendezvous``: ``rendezvous.py``).
- It says when it restarts the workers and why, and each new round's size
  (``restart_reports``); it does not restart them for a failure that a restart meets again (a
  usage error, or a ``MultiGPUError`` marked ``final``): the run ends with its one line.
- The nodes end with one outcome: a node whose workers failed makes the others exit 1 at once,
  not 0 after the exit barrier's timeout (``exit_agreement``).
- The stores it hosts listen on the one address their clients dial (loopback on one node, the
  cluster interface on several), not on every interface as torch's do (``store_listen``).

For the time of the block torch's ``launch_agent`` builds ours and a rendezvous handler that
waits for the store first (``torch_compat.launch_agent_made_by``: the module names it looks
them up by, and the two protected methods overridden, are torch internals listed with their
canaries in ``torch_compat/elastic.py``). The exit barrier's bound is torch's own
``exit_barrier_timeout`` argument; torchrun's command line has no option for it.

The agent's parts, beside it: ``start_agreement`` (the nodes started alike), ``exit_agreement``
(one outcome for every node), ``rendezvous`` (torch's handler seen through its public
interface), ``restart_reports`` (why the workers restart, each round's size).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from multigpu.common.store_listen import listening_store
from multigpu.common.store_reach import wait_until_listening
from multigpu.launch.agent.exit_agreement import ExitAgreement
from multigpu.launch.agent.restart_reports import RestartReports, RoundReports
from multigpu.launch.agent.start_agreement import check_nodes_agree, node_facts
from multigpu.launch.failure_summary import failures_of
from multigpu.launch.options import parse_nnodes
from multigpu.launch.ports import dialled_store
from multigpu.launch.stopped_workers import StoppedWorkers
from multigpu.launch.timeouts import STORE_GRACE_S, store_call_bound
from multigpu.torch_compat import (
    elastic_agent_class,
    launch_agent_made_by,
    store_servers_made_by,
)


@contextlib.contextmanager
def multigpu_agent(timeout_s: float, nnodes: str, nproc_per_node: int) -> Iterator[StoppedWorkers]:
    """Inside the block, ``torch.distributed.run.run(args)`` runs multigpu's agent.

    ``timeout_s`` (``--timeout``) bounds the exit barrier, the store connections and the nodes'
    agreement check; ``nnodes`` (this node's ``--nnodes``) is compared with the other nodes';
    ``nproc_per_node`` (its workers) counts in each round's world size.
    Yields the record of the workers found stopped when the agent ended them.
    """
    from torch.distributed.elastic.agent.server.api import WorkerGroup, WorkerState

    from multigpu.launch.agent.rendezvous import ObservedRendezvous

    facts = node_facts(nnodes, nproc_per_node)
    stopped = StoppedWorkers()
    rounds, restarts = RoundReports(), RestartReports()
    restarted_on = (WorkerState.UNHEALTHY, WorkerState.FAILED)  # as in torch's run loop
    agreement = ExitAgreement(timeout_s)

    class MultigpuAgent(elastic_agent_class()):  # type: ignore[misc]
        """torchrun's agent. These three methods are every override multigpu makes of it; the
        two protected ones are ``torch_compat.AGENT_OVERRIDES``, canary-tested there."""

        def run(self, role: str = "default") -> Any:
            result = super().run(role)
            if result is not None and result.is_failed():  # None: the rendezvous was closed
                agreement.announce_failure(self.get_worker_group(role), result)
            return result

        def _monitor_workers(self, worker_group: WorkerGroup) -> Any:
            # Before torch's check, which on a failure stops the others and would wait 30 s
            # for a stopped one: once a worker failed, the stopped ones are let go on.
            stopped.release_if_failed(
                {w.global_rank: w.id for w in worker_group.workers if isinstance(w.id, int)}
            )
            result = super()._monitor_workers(worker_group)
            remaining = int(getattr(self, "_remaining_restarts"))  # noqa: B009 (untyped in torch)
            if result.state in restarted_on and remaining > 0:
                causes = failures_of(result)
                if causes and causes[0].final:
                    # The same input would be refused again: torch's loop ends the run when no
                    # restart is left (torch_compat.AGENT_ATTRIBUTES).
                    self._remaining_restarts = 0
                    return result
                # torch's loop restarts the workers next, and counts it: say why, and which.
                restarts.failed(worker_group, result, remaining - 1)
            return result

        def _exit_barrier(self) -> None:
            # In place of torch's barrier, which waits for every node and then exits 0 even
            # when another node's workers failed.
            agreement.barrier(self.get_worker_group())

    def after_each_round(info: Any) -> None:
        # The round's store, node rank and node count, before the agent starts any worker.
        found = check_nodes_agree(info.store, info.rank, info.world_size, facts, timeout_s)
        rounds.report(info.world_size, sum(int(f.get("nproc", 0)) for f in found))

    def handler_once_the_store_answers(make_handler: Any, params: Any) -> Any:
        store = dialled_store(params)
        if store is not None:  # raises StoreUnreachable (run.describe_agent_error words it)
            wait_until_listening(*store, timeout_s)
        # The node that hosts the store leaves last (etcd's store is nobody's to keep).
        agreement.hosts_store = store is None and params.backend in ("c10d", "static")
        return ObservedRendezvous(make_handler(params), after_each_round, restarts.admitting)

    ours = functools.partial(MultigpuAgent, exit_barrier_timeout=timeout_s)
    many_nodes = parse_nnodes(nnodes)[1] > 1
    stores = functools.partial(listening_store, many_nodes=many_nodes)
    with (
        launch_agent_made_by(ours, handler_once_the_store_answers),
        store_servers_made_by(store_call_bound(stores, timeout_s + STORE_GRACE_S)),
    ):
        yield stopped

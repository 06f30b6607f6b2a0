"""The nodes of a run end with one outcome: a node whose workers failed fails every node.

torch's agent ends a node whose workers all exited 0 with an exit barrier: it waits for the other
nodes' agents, and if one never comes (its workers failed, so it skipped the barrier, or it
died) it logs the timeout and exits 0. A worker that aborted at teardown on one node (exit 1
there) thus left the other node waiting the whole timeout and then exiting 0: the nodes
disagreed on the job's outcome.

Here, the agents agree through the rendezvous store instead (keys under ``multigpu/exit/``):

- a node whose workers failed for good writes what failed under ``outcome`` (unless set);
- a node whose workers succeeded counts itself in ``arrived``; the last one writes ``ok``
  under ``outcome`` (never over a failure: ``compare_set``);
- a node that succeeded waits for ``outcome`` (at most ``--timeout``): ``ok`` ends it with 0,
  a failure, a timeout or a lost store with one line and exit code 1;
- every node then closes the rendezvous (torch's launcher would do it after the agent ends) and
  counts itself in ``left``: that is its last call to the store. The node that hosts the store
  alone then waits (``LEAVE_S`` at most) until every node has counted itself out, so that it does
  not take the store away while another node still talks to it: a node whose call was answered
  by a store that had gone printed a ``TCPStore ... recvVector failed`` (or
  ``recvValueWithTimeout failed``) trace and a warning in a run that succeeded (seen under load
  on two network-namespace nodes). Every node waiting for a key set by the last one out was not
  enough: the host left as soon as it read the key, while another node's request for it could
  still be on its way.
"""

from __future__ import annotations

import logging
import socket
import time
from datetime import timedelta
from typing import Any

from multigpu.errors import LaunchError
from multigpu.launch.failure_summary import failures_of, say, summary_line

log = logging.getLogger(__name__)

PREFIX = "multigpu/exit/"
LEAVE_S = 5.0
"""How long the store's host waits, after the outcome, for every node to have read it."""
POLL_S = 0.05
"""How often the store's host counts the nodes that have left."""
OK = "ok"


class NodeFailedError(LaunchError):
    """This node's workers finished, but the run failed elsewhere (or a node never finished)."""


class ExitAgreement:
    """What a node's agent does once its workers have ended, for every node to end alike.

    ``barrier`` replaces torch's exit barrier (the workers all succeeded); ``announce_failure``
    follows a run whose workers failed for good. The agent that calls them is in
    ``launch/agent/__init__.py``.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.hosts_store = False
        """Whether this node's agent hosts the rendezvous store (set once the handler is made)."""

    def barrier(self, worker_group: Any) -> None:
        """This node's workers succeeded: wait for the run's outcome (raises NodeFailedError
        when it failed elsewhere, or did not come within the timeout)."""
        nodes = worker_group.group_world_size or 1
        if nodes == 1:
            return  # nobody to agree with (torch's barrier of one returns at once)
        store, timeout = worker_group.store, float(self.timeout_s)
        here = socket.gethostname()
        try:
            if store.add(PREFIX + "arrived", 1) == nodes:
                store.compare_set(PREFIX + "outcome", "", OK)
            outcome = _wait_for(store, PREFIX + "outcome", timeout)
        except Exception as e:  # a timeout, or the store's host is gone
            log.debug("exit agreement failed", exc_info=True)
            raise NodeFailedError(
                f"the workers on {here} finished, but not every node's did within {timeout:g} s "
                f"(--timeout), or the node holding the rendezvous store went away "
                f"({type(e).__name__}: {_first_line(e)}); the run did not finish on every node: "
                "see the other nodes' output"
            ) from None
        _close_rendezvous(worker_group)
        _leave(store, nodes, self.hosts_store)
        if outcome != OK:
            raise NodeFailedError(
                f"the workers on {here} finished, but the run failed on another node: {outcome}"
            )

    def announce_failure(self, worker_group: Any, result: Any) -> None:
        """This node's workers failed for good (``result``): tell the other nodes."""
        nodes = worker_group.group_world_size or 1
        store = worker_group.store
        if nodes == 1 or store is None or not getattr(result, "failures", None):
            return
        what = summary_line(failures_of(result), log_hint="its output is on that node")
        try:
            store.compare_set(PREFIX + "outcome", "", what)
            _close_rendezvous(worker_group)
            _leave(store, nodes, self.hosts_store)
        except Exception as e:  # the others then end on their timeout, with exit code 1 too
            say(
                f"could not tell the other nodes that this node failed ({e}); they stop when "
                "--timeout ends their wait"
            )


def _close_rendezvous(worker_group: Any) -> None:
    # Now, while every node's store connection is still good; torch's launcher calls
    # shutdown() again once the agent has returned, which launch/agent/rendezvous.py makes a no-op.
    worker_group.spec.rdzv_handler.shutdown()


def _wait_for(store: Any, key: str, timeout_s: float) -> str:
    """``store.get(key)``, waiting at most ``timeout_s`` for the key to be set."""
    previous = store.timeout
    store.set_timeout(timedelta(seconds=timeout_s))
    try:
        return bytes(store.get(key)).decode()
    finally:
        store.set_timeout(previous)


def _leave(store: Any, nodes: int, hosts_store: bool) -> None:
    """Count this node out: its last call to the store. The store's host then waits
    (``LEAVE_S`` at most) until every node has: it must not take the store away before."""
    try:
        left = store.add(PREFIX + "left", 1)
        deadline = time.monotonic() + LEAVE_S
        while hosts_store and left < nodes and time.monotonic() < deadline:
            time.sleep(POLL_S)
            left = store.add(PREFIX + "left", 0)
        if left < nodes and hosts_store:
            log.debug("not every node left within %g s", LEAVE_S)
    except Exception:  # a node that died does not leave: no reason to wait longer
        log.debug("counting this node out failed", exc_info=True)


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else ""

"""After each rendezvous, before any worker starts, the nodes' launchers check they agree.

torch's c10d rendezvous takes each node's ``--nnodes`` at its word. Nodes started with 2 and 3
either wait out the join deadline, or — when the node that expects fewer completes the round —
train together, the other node's ``--nnodes`` silently ignored (1 launch in 4 on two test
hosts). Nodes with different torch, Python or multigpu versions form a job that hangs or
diverges far from the cause, and a plain torchrun script never calls the workers' own check
(``multigpu.init``). So after every rendezvous round each node's agent writes what it was started
with to the round's store and reads the others'; on a difference every node stops with the same
line naming the nodes, before a worker starts. Two store round trips per round, none per step.

The round's store is torch's: a fresh key prefix per c10d round, so a restart compares the
nodes of the new round only.
"""

from __future__ import annotations

import json
import logging
import socket
from datetime import timedelta
from typing import Any

from multigpu.common.versions import local_versions, mismatch_message
from multigpu.errors import LaunchError, MultiGPUError, UsageError

logger = logging.getLogger(__name__)

KEY_PREFIX = "multigpu/launch/"
"""Keys this check writes in the rendezvous round's store."""


def normalize_nnodes(nnodes: str) -> str:
    """``--nnodes`` as one spelling: ``"2"`` and ``"2:2"`` are the same request."""
    low, _, high = (part.strip() for part in str(nnodes).partition(":"))
    return f"{low}:{high}" if high and high != low else low


def node_facts(nnodes: str, nproc_per_node: int = 1) -> dict[str, Any]:
    """What this node's launcher was started with, as the other nodes must see it
    (``nproc``, its workers, is shared, not compared: torchrun lets nodes differ there)."""
    return {
        "host": socket.gethostname(),
        "nnodes": normalize_nnodes(nnodes),
        "nproc": nproc_per_node,
        "versions": local_versions(),
    }


def disagreement(found: list[dict[str, Any]]) -> MultiGPUError | None:
    """The error for nodes (``found[i]`` = node ``i``'s facts) that disagree; None if they agree.

    Different ``--nnodes`` is a usage error (exit 2); different software is not.
    """
    problems = []
    groups: dict[str, list[str]] = {}
    for rank, facts in enumerate(found):
        groups.setdefault(str(facts.get("nnodes")), []).append(f"node {rank} ({facts['host']})")
    if len(groups) > 1:
        problems.append(
            "the nodes were started with different --nnodes: "
            + ", ".join(f"{n} on {', '.join(where)}" for n, where in groups.items())
            + "; start `multigpu run` with the same --nnodes on every node, and a new --rdzv-id"
        )
    software = mismatch_message(found, who="node")
    if software is not None:
        problems.append(software)
    if not problems:
        return None
    message = "; ".join(problems)
    return UsageError(message) if len(groups) > 1 else LaunchError(message)


def check_nodes_agree(
    store: Any, node_rank: int, nnodes: int, facts: dict[str, Any], timeout_s: float
) -> list[dict[str, Any]]:
    """Share ``facts`` with the round's other nodes through ``store``; raise if any differs.
    Returns every node's facts, node ``i``'s at ``i``.

    ``node_rank`` and ``nnodes`` are the round's (torch's group rank and world size). Every
    node raises the same error, and only after every node has read the others' facts: the
    node that hosts the store must not end (taking the store with it) before the others know.

    Raises:
        UsageError: the nodes were started with different ``--nnodes``.
        LaunchError: they run different software, or a node did not share its facts within
            ``timeout_s`` (it was not started by ``multigpu run``, or it is gone).
    """
    if nnodes < 2:
        return [facts]
    wait = timedelta(seconds=timeout_s)
    store.set(f"{KEY_PREFIX}facts/{node_rank}", json.dumps(facts))
    keys = [f"{KEY_PREFIX}facts/{rank}" for rank in range(nnodes)]
    try:
        store.wait(keys, wait)
    except Exception as e:
        raise _missing_error(store, keys, node_rank, facts, timeout_s) from e
    found = [json.loads(store.get(key)) for key in keys]
    error = disagreement(found)
    if error is None:
        return found
    read = [f"{KEY_PREFIX}read/{rank}" for rank in range(nnodes)]
    store.set(read[node_rank], "1")
    try:
        store.wait(read, wait)
    except Exception as e:  # the others know already, or are gone: the error is the same
        logger.debug("not every node confirmed the disagreement: %s", e)
    raise error


def _missing_error(
    store: Any, keys: list[str], node_rank: int, facts: dict[str, Any], timeout_s: float
) -> MultiGPUError:
    """Not every node shared its facts in time: a disagreement if those that did already
    disagree (a static rendezvous with different --nnodes), else the nodes that are missing.
    """
    here = [key for key in keys if _has(store, key)]
    if len(here) > 1 and here == keys[: len(here)]:  # node i at position i in the message
        try:
            error = disagreement([json.loads(store.get(key)) for key in here])
        except Exception:  # the store is gone meanwhile: say who was missing
            error = None
        if error is not None:
            return error
    missing = ", ".join(key.rsplit("/", 1)[1] for key in keys if key not in here)
    return LaunchError(
        f"node {missing} of the rendezvous did not share what it was started with within "
        f"{timeout_s:g} s (this node, {facts['host']}, is node {node_rank}): start every node "
        "with `multigpu run` (not torchrun) and the same options, or raise --timeout"
    )


def _has(store: Any, key: str) -> bool:
    try:
        return bool(store.check([key]))
    except Exception:  # the store is gone: nothing more to read
        return False

"""The nodes' launchers compare what they were started with after each rendezvous round.

The store is a real ``TCPStore`` on localhost with a key prefix per round, as torch's c10d
rendezvous hands it to the agent; each "node" is a thread that holds its own client.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from multigpu import torch_compat
from multigpu.common.versions import local_versions
from multigpu.errors import LaunchError, UsageError
from multigpu.launch.agent import multigpu_agent
from multigpu.launch.agent.start_agreement import (
    check_nodes_agree,
    disagreement,
    node_facts,
    normalize_nnodes,
)

VERSIONS = {"torch": "2.13.0", "python": "3.11.7", "multigpu": "0.1.0"}


def _facts(host: str, nnodes: str = "2", **versions: str) -> dict[str, Any]:
    return {"host": host, "nnodes": nnodes, "versions": {**VERSIONS, **versions}}


def test_nnodes_spellings_of_the_same_request_agree() -> None:
    assert normalize_nnodes("2:2") == normalize_nnodes("2") == "2"
    assert normalize_nnodes("1:2") == "1:2" != normalize_nnodes("2")
    facts = node_facts("2:2")
    assert facts["nnodes"] == "2" and facts["versions"] == local_versions()


def test_nodes_that_agree_have_no_disagreement() -> None:
    assert disagreement([_facts("n0"), _facts("n1")]) is None


def test_different_nnodes_is_a_usage_error_naming_every_node() -> None:
    error = disagreement([_facts("n0", "2"), _facts("n1", "3"), _facts("n2", "2")])
    assert isinstance(error, UsageError)
    assert str(error) == (
        "the nodes were started with different --nnodes: 2 on node 0 (n0), node 2 (n2), "
        "3 on node 1 (n1); start `multigpu run` with the same --nnodes on every node, and a "
        "new --rdzv-id"
    )


def test_different_software_is_a_launch_error_naming_the_nodes() -> None:
    error = disagreement([_facts("n0"), _facts("n1", torch="2.12.1")])
    assert isinstance(error, LaunchError) and not isinstance(error, UsageError)
    assert str(error) == (
        "nodes run different software: torch 2.13.0 on node 0 (n0), 2.12.1 on node 1 (n1); "
        "install the same versions on every node"
    )
    both = disagreement([_facts("n0", "2"), _facts("n1", "1:2", python="3.12.0")])
    assert isinstance(both, UsageError)  # the option first: exit 2
    assert "different --nnodes" in str(both) and "python 3.11.7 on node 0" in str(both)


def _nodes(
    facts: list[dict[str, Any] | None], timeout_s: float, round_: int = 0
) -> list[BaseException | None]:
    """Run check_nodes_agree as node i with facts[i] (None: a node that never checks)."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    results: list[BaseException | None] = [None] * len(facts)

    def node(rank: int, mine: dict[str, Any]) -> None:
        client = dist.TCPStore("127.0.0.1", server.port, is_master=False)
        store = dist.PrefixStore(f"torch.rendezvous.job.{round_}", client)
        try:
            check_nodes_agree(store, rank, len(facts), mine, timeout_s)
        except BaseException as e:
            results[rank] = e

    threads = [
        threading.Thread(target=node, args=(rank, mine), daemon=True)
        for rank, mine in enumerate(facts)
        if mine is not None
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s + 30)
        assert not thread.is_alive(), "a node hangs in the agreement check"
    return results


def test_nodes_that_agree_go_on() -> None:
    assert _nodes([_facts("n0"), _facts("n1")], timeout_s=10) == [None, None]


def test_every_node_stops_with_the_same_line_when_they_disagree() -> None:
    results = _nodes([_facts("n0", "2"), _facts("n1", "3")], timeout_s=10)
    assert all(isinstance(e, UsageError) for e in results), results
    assert str(results[0]) == str(results[1])
    assert "2 on node 0 (n0), 3 on node 1 (n1)" in str(results[0])


def test_a_node_that_does_not_check_is_named_after_the_timeout() -> None:
    began = time.monotonic()
    results = _nodes([_facts("n0"), None], timeout_s=1)
    assert time.monotonic() - began < 10
    error = results[0]
    assert isinstance(error, LaunchError), error
    assert str(error).startswith("node 1 of the rendezvous did not share what it was started")
    assert "(this node, n0, is node 0)" in str(error) and "not torchrun" in str(error)


def test_the_agent_is_ours_inside_the_block_only() -> None:
    import torch.distributed.launcher.api as launcher_api
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    original = launcher_api.LocalElasticAgent
    with multigpu_agent(12, "2", 1):
        made: Callable[..., Any] = launcher_api.LocalElasticAgent
        assert made.keywords == {"exit_barrier_timeout": 12}  # type: ignore[attr-defined]
        assert issubclass(made.func, LocalElasticAgent)  # type: ignore[attr-defined]
        assert made.func is not LocalElasticAgent  # type: ignore[attr-defined]
        # Its protected overrides are the listed ones, each with its canary (torch_compat).
        defined = vars(made.func)  # type: ignore[attr-defined]
        protected = {
            n for n, v in defined.items() if n[:1] == "_" and n[:2] != "__" and callable(v)
        }
        assert protected == set(torch_compat.AGENT_OVERRIDES), protected
    assert launcher_api.LocalElasticAgent is original


def test_one_node_checks_nothing() -> None:
    # No store round trip at all: a store that refuses every call proves it.
    class Refusing:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"store.{name} called on one node")

    check_nodes_agree(Refusing(), 0, 1, node_facts("1:2"), 5)  # an elastic job down to 1

"""launch/agent/rendezvous.py: torch's c10d rendezvous handler seen through its public interface.

One real handler on a free loopback port (one node): each round's result reaches ``on_round``
before ``next_rendezvous`` returns it, the rest is torch's, and ``shutdown`` acts once.
"""

from __future__ import annotations

from typing import Any

from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

from multigpu.launch.agent.rendezvous import ObservedRendezvous
from multigpu.testing.distributed import free_port


def test_each_round_is_seen_and_the_handler_closes_once() -> None:
    params = RendezvousParameters(
        "c10d", f"127.0.0.1:{free_port()}", "observed", 1, 1, join_timeout=10
    )
    torch_handler = get_rendezvous_handler(params)
    closes: list[bool] = []
    close = torch_handler.shutdown

    def counted_close() -> bool:
        closes.append(close())
        return closes[-1]

    torch_handler.shutdown = counted_close  # type: ignore[method-assign]
    rounds: list[Any] = []
    handler = ObservedRendezvous(torch_handler, rounds.append)
    assert isinstance(handler, RendezvousHandler)
    assert (handler.get_backend(), handler.get_run_id()) == ("c10d", "observed")
    assert handler.use_agent_store == torch_handler.use_agent_store
    assert handler.settings is torch_handler.settings  # type: ignore[attr-defined]

    info = handler.next_rendezvous()
    assert rounds == [info] and (info.rank, info.world_size) == (0, 1)
    info.store.set("multigpu/seen", "1")  # the round's store is torch's, alive
    assert handler.num_nodes_waiting() == 0 and not handler.is_closed()

    assert handler.shutdown() is True and handler.shutdown() is True
    assert closes == [True]  # torch's shutdown ran once
    assert handler.is_closed()


def test_a_node_waiting_to_join_is_handed_to_on_waiting() -> None:
    """An elastic rendezvous (1 to 2 nodes) closed with one node; a second node then asks to
    join: the first node's ``num_nodes_waiting`` (which torch's agent asks while its workers
    are healthy, before restarting them to admit the newcomer) hands the count on."""
    import threading

    endpoint = f"127.0.0.1:{free_port()}"

    def handler(node: str) -> RendezvousHandler:
        params = RendezvousParameters(
            "c10d", endpoint, "elastic", 1, 2, join_timeout=10, last_call_timeout=1
        )
        params.config["is_host"] = node == "first"
        return get_rendezvous_handler(params)

    waiting: list[int] = []
    first = ObservedRendezvous(handler("first"), lambda info: None, waiting.append)
    first.next_rendezvous()
    assert first.num_nodes_waiting() == 0 and waiting == []
    second = handler("second")
    joining = threading.Thread(target=second.next_rendezvous, daemon=True)
    joining.start()  # it waits for the first node to take part in a new round
    for _ in range(200):
        if first.num_nodes_waiting():
            break
        joining.join(0.05)
    assert waiting and waiting[-1] == 1, waiting
    first.shutdown()  # the second node's wait ends: the rendezvous is closed
    joining.join(10)
    assert not joining.is_alive()

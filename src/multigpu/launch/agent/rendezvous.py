"""The rendezvous handler multigpu's agent gets: torch's, seen through its public interface.

Everything the launcher does at a rendezvous goes through torch's ``RendezvousHandler`` API
(``next_rendezvous``, ``shutdown``, ...) instead of overriding the agent's protected
``_rendezvous``: the agent calls ``next_rendezvous()`` once per round and nothing else, so

- each round's result is handed to ``on_round`` before the agent assigns ranks and starts the
  workers (the nodes' agreement check, the round's report);
- ``shutdown()`` acts once: the exit agreement closes the rendezvous before the nodes leave, and
  torch's launcher closes it again afterwards, when the store's host may be gone;
- nodes waiting to join are handed to ``on_waiting`` when the agent asks how many there are
  (it asks while its workers are healthy, and restarts them to admit the waiting nodes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousInfo


class ObservedRendezvous(RendezvousHandler):
    """``handler`` (torch's), with ``on_round(info)`` after each round, ``on_waiting(n)`` when
    ``n > 0`` nodes wait to join, and one ``shutdown``."""

    def __init__(
        self,
        handler: RendezvousHandler,
        on_round: Callable[[RendezvousInfo], None],
        on_waiting: Callable[[int], None] = lambda waiting: None,
    ):
        self._handler = handler
        self._on_round = on_round
        self._on_waiting = on_waiting
        self._shut: list[bool] = []

    def next_rendezvous(self) -> RendezvousInfo:
        info = self._handler.next_rendezvous()
        self._on_round(info)
        return info

    def shutdown(self) -> bool:
        if not self._shut:
            self._shut.append(self._handler.shutdown())
        return self._shut[0]

    def get_backend(self) -> str:
        return self._handler.get_backend()

    @property
    def use_agent_store(self) -> bool:
        return self._handler.use_agent_store

    def is_closed(self) -> bool:
        return self._handler.is_closed()

    def set_closed(self) -> None:
        self._handler.set_closed()

    def num_nodes_waiting(self) -> int:
        waiting = self._handler.num_nodes_waiting()
        if waiting > 0:
            self._on_waiting(waiting)
        return waiting

    def get_run_id(self) -> str:
        return self._handler.get_run_id()

    def __getattr__(self, name: str) -> Any:
        # Anything else torch's handler has (settings, a backend's own attributes).
        return getattr(self._handler, name)

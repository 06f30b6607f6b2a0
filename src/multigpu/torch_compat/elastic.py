"""Where store servers are made, the elastic agent's protected methods, the default group's store
(see ``multigpu.torch_compat``).

Every torch name the launcher reaches that is not torch's public API, with the canary (in
``tests/core/test_torch_compat.py`` unless named) that fails when a torch release changes it:

==========================================  ===================================  =================
torch name                                  what multigpu does with it           canary
==========================================  ===================================  =================
``SimpleElasticAgent._monitor_workers``     overrides: lets stopped workers go,  ``..._calls_the_
                                            keeps the result for the restart     methods_multigpu
                                            line (launch/agent.py)               _overrides``
``SimpleElasticAgent._restart_workers``     overrides: says the restart          same
``SimpleElasticAgent._exit_barrier``        overrides: the nodes' exit           ``..._ends_
                                            agreement (launch/agent.py,          through_the_exit
                                            exit_agreement)                      _barrier...``
``SimpleElasticAgent._remaining_restarts``  reads (``AGENT_ATTRIBUTES``): the    ``..._has_every_
                                            restart's number                     protected_member
                                                                                 _multigpu_uses``
``launcher.api.LocalElasticAgent``          swapped for the block: torchrun      ``..._through_the
                                            builds multigpu's agent              _names_we_
                                            (``launch_agent_made_by``)           replace``
``registry.get_rendezvous_handler``         swapped for the block: the handler   same
                                            waits for the store and is observed
                                            (launch/rendezvous.py)
``TCPStore`` of three modules,              swapped for the block: servers bound ``tests/core/test
``DynamicRendezvousHandler.                 to one address                       _store_listen.py``
_create_tcp_store_server``                  (``store_servers_made_by``)
==========================================  ===================================  =================

Public extension points used instead: ``ElasticAgent.run`` (a failure is announced to the
other nodes after it), ``get_worker_group`` and ``WorkerGroup.store`` (in place of the agent's
``_worker_group`` and ``_store``), the ``RendezvousHandler`` interface (each round's nodes'
agreement check and report after ``next_rendezvous``; ``shutdown`` once), and
``LocalElasticAgent``'s ``exit_barrier_timeout`` argument. torch's handler registry cannot
replace them: ``register`` refuses a second creator for ``c10d`` or ``static``, and another
backend name changes what torchrun does (``static`` is special-cased by name).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

STORE_MODULES = (
    "torch.distributed.rendezvous",
    "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend",
    "torch.distributed.elastic.rendezvous.static_tcp_rendezvous",
)
"""The modules that build their ``TCPStore`` servers through their module name ``TCPStore``."""


@contextlib.contextmanager
def store_servers_made_by(make: Callable[..., Any], *, elastic: bool = True) -> Iterator[None]:
    """Inside the block, torch's rendezvous code makes each ``TCPStore`` through
    ``make(TCPStore, host, port, *args, **kwargs)`` (clients too: ``make`` tells them apart by
    ``is_master``). ``elastic``: the agent's too (its rendezvous backends and the store its
    handler shares with the workers); False: only ``init_process_group``'s (a worker's)."""
    import torch.distributed as tdist

    def store(*args: Any, **kwargs: Any) -> Any:
        return make(tdist.TCPStore, *args, **kwargs)

    def shared_server(self: Any, master_addr: str, master_port: int) -> Any:
        # torch's own: TCPStore(host_name=..., port=..., is_master=True, multi_tenant=True)
        return make(tdist.TCPStore, master_addr, master_port, is_master=True, multi_tenant=True)

    patches: list[tuple[Any, str, Any]] = [
        (importlib.import_module(name), "TCPStore", store)
        for name in (STORE_MODULES if elastic else STORE_MODULES[:1])
    ]
    if elastic:
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
            DynamicRendezvousHandler as handler,
        )

        patches.append((handler, "_create_tcp_store_server", shared_server))
    originals = [(owner, name, owner.__dict__[name]) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in originals:
            setattr(owner, name, value)


AGENT_OVERRIDES = ("_monitor_workers", "_restart_workers", "_exit_barrier")
"""``LocalElasticAgent``'s protected methods that multigpu's agent overrides (launch/)."""

AGENT_ATTRIBUTES = ("_remaining_restarts",)
"""Its protected attributes those overrides read."""


def elastic_agent_class() -> type:
    """torchrun's ``LocalElasticAgent``, to subclass (RuntimeError when it lacks one of
    ``AGENT_OVERRIDES``)."""
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    missing = [
        name for name in AGENT_OVERRIDES if not callable(getattr(LocalElasticAgent, name, None))
    ]
    if missing:
        raise RuntimeError(
            f"torch {torch.__version__}'s LocalElasticAgent has no {', '.join(missing)}, which "
            "multigpu's launcher overrides; install a torch release multigpu supports"
        )
    return LocalElasticAgent


@contextlib.contextmanager
def launch_agent_made_by(
    agent: Callable[..., Any], handler: Callable[[Callable[..., Any], Any], Any]
) -> Iterator[None]:
    """Inside the block torchrun's ``launch_agent`` builds its agent with ``agent(...)`` (the
    arguments of ``LocalElasticAgent``) and its rendezvous handler with
    ``handler(get_rendezvous_handler, params)`` (torch's maker, to call when ready)."""
    import torch.distributed.elastic.rendezvous.registry as rdzv_registry
    import torch.distributed.launcher.api as launcher_api

    original_agent = launcher_api.LocalElasticAgent
    make_handler = rdzv_registry.get_rendezvous_handler
    setattr(launcher_api, "LocalElasticAgent", agent)  # noqa: B010 (a module attribute)
    setattr(rdzv_registry, "get_rendezvous_handler", functools.partial(handler, make_handler))  # noqa: B010
    try:
        yield
    finally:
        setattr(launcher_api, "LocalElasticAgent", original_agent)  # noqa: B010
        setattr(rdzv_registry, "get_rendezvous_handler", make_handler)  # noqa: B010


def default_store() -> Any:
    """The default process group's store (raises when the group has none, or none exists)."""
    from torch.distributed.distributed_c10d import _get_default_store

    return _get_default_store()

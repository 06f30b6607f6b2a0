"""Where store servers are made, the elastic agent's protected methods, the default group's store
(see ``multigpu.torch_compat``).

Every torch name the launcher reaches that is not torch's public API, and the canary in
``tests/core/test_torch_compat.py`` that fails when a torch release changes it:

- ``SimpleElasticAgent._monitor_workers``: overridden in ``launch/agent/`` (stopped workers
  let go on; a restart said, with its cause, when torch's loop will restart on the check's
  result) — ``test_the_elastic_agent_still_calls_the_methods_multigpu_overrides``.
- ``SimpleElasticAgent._exit_barrier``: overridden in ``launch/agent/`` (the nodes' exit
  agreement, ``launch/exit_agreement.py``) —
  ``test_the_elastic_agent_still_ends_through_the_exit_barrier_multigpu_overrides``.
- ``SimpleElasticAgent._remaining_restarts``: read for whether the loop restarts, and the
  restart's number; set to 0 for a failure no restart can help (``AGENT_ATTRIBUTES``)
  — ``test_the_agent_class_has_every_protected_member_multigpu_uses``.
- the module names ``launcher.api.LocalElasticAgent`` and ``registry.get_rendezvous_handler``:
  swapped for the block, so that torchrun builds multigpu's agent and a handler that waits for
  the store and is observed (``launch_agent_made_by``, ``launch/rendezvous.py``) —
  ``test_torchrun_still_builds_its_agent_and_rendezvous_handler_through_the_names_we_replace``.
- the module name ``TCPStore`` of ``STORE_MODULES`` and
  ``DynamicRendezvousHandler._create_tcp_store_server``: swapped for the block, so that store
  servers listen on one address and the agent's store connections carry the kernel's
  ``TCP_USER_TIMEOUT`` (``store_servers_made_by``, ``launch/timeouts.store_call_bound``) —
  ``tests/core/test_store_listen.py``.

Public API used instead of more overrides: ``ElasticAgent.run`` (a failure is announced to the
other nodes after it), ``get_worker_group`` and ``WorkerGroup.store`` (not the agent's
``_worker_group`` and ``_store``), and the ``RendezvousHandler`` interface (each round's nodes'
check and report after ``next_rendezvous``; nodes waiting to join said by ``num_nodes_waiting``;
``shutdown`` acting once) in place of overriding ``_rendezvous``, ``_invoke_run`` and
``_restart_workers``. torch's handler registry cannot replace the
``get_rendezvous_handler`` swap: ``register`` refuses a second creator for ``c10d`` or
``static``, and another backend name changes what torchrun does (torchrun and ``launch_agent``
special-case ``static`` by name).
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


AGENT_OVERRIDES = ("_monitor_workers", "_exit_barrier")
"""``LocalElasticAgent``'s protected methods that multigpu's agent overrides (launch/)."""

AGENT_ATTRIBUTES = ("_remaining_restarts",)
"""Its protected attributes those overrides read (and, to end a run a restart cannot help,
write: torch's run loop restarts only while it is above 0)."""


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

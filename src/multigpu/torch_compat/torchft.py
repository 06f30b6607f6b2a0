"""The one torchft internal multigpu reaches into: where a replica group's manager server listens.

torchft 0.2's ``Manager.__init__`` starts its ``ManagerServer`` with ``bind=f"[::]:{port}"``
(every interface, hard-coded) through the module name ``torchft.manager.ManagerServer``. For the
time of ``manager_server_bound_to(address)`` that name makes the server on ``address`` instead
(loopback on one node, the cluster interface on several), the rule every listener of multigpu
follows. ``tests/replicas/test_torchft_compat.py`` fails when torchft stops calling it so.

torchft is an optional extra (``pip install multigpu[ft]``); nothing here imports it before a
replica group asks for it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

TORCHFT_TESTED = ("0.2",)
"""The torchft releases whose ``Manager`` binds through ``torchft.manager.ManagerServer``."""


def _bound(make_server: Any, address: str, **kwargs: Any) -> Any:
    port = str(kwargs.get("bind", ":0")).rsplit(":", 1)[1]
    host = f"[{address}]" if ":" in address else address
    return make_server(**{**kwargs, "bind": f"{host}:{port}"})


@contextlib.contextmanager
def manager_server_bound_to(address: str) -> Iterator[None]:
    """Inside the block, a torchft ``Manager`` made here listens on ``address`` (its port kept).

    Raises:
        RuntimeError: the installed torchft no longer has ``torchft.manager.ManagerServer``
            (a release this was not written for: see ``TORCHFT_TESTED``).
    """
    import torchft.manager as manager_module

    original = getattr(manager_module, "ManagerServer", None)
    if original is None:
        raise RuntimeError(
            "torchft.manager.ManagerServer is gone in this torchft release; multigpu supports "
            f"torchft {', '.join(TORCHFT_TESTED)} (pip install 'multigpu[ft]')"
        )
    manager_module.ManagerServer = functools.partial(_bound, original, address)
    try:
        yield
    finally:
        manager_module.ManagerServer = original

"""Canary of ``multigpu.torch_compat.torchft``: torchft's Manager still starts its server through
``torchft.manager.ManagerServer``, so that it can be bound to one address (torchft: every one)."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
import torch

from multigpu.common.store_listen import listening_store
from multigpu.testing.listeners import listeners_of
from multigpu.torch_compat import manager_server_bound_to

pytest.importorskip("torchft", reason="torchft (pip install multigpu[ft]) is not installed")


def test_the_manager_server_listens_on_the_address_given() -> None:
    from torch.distributed import TCPStore
    from torchft.checkpointing.pg_transport import PGTransport
    from torchft.coordination import LighthouseServer
    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo

    before = {a for found in listeners_of(os.getpid()).values() for a in found}
    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1)
    store = listening_store(TCPStore, host_name="127.0.0.1", port=0, is_master=True,
                            wait_for_workers=False, many_nodes=False)  # fmt: skip
    pg = ProcessGroupGloo(timeout=timedelta(seconds=5))
    port = str(lighthouse.address()).rsplit(":", 1)[1]
    with manager_server_bound_to("127.0.0.1"):
        manager = Manager(
            pg=pg, load_state_dict=None, state_dict=None, min_replica_size=1, rank=0,
            world_size=1, store_addr="127.0.0.1", store_port=store.port,
            lighthouse_addr=f"http://127.0.0.1:{port}", replica_id="canary_0",
            hostname="127.0.0.1",
            checkpoint_transport=PGTransport(pg, timedelta(seconds=5), torch.device("cpu")),
        )  # fmt: skip
    try:
        after = {a for found in listeners_of(os.getpid()).values() for a in found}
        new = after - before
        assert len(new) >= 3  # the lighthouse, the store, the manager server
        assert all(a.startswith("127.0.0.1:") for a in new), new
    finally:
        manager.shutdown(wait=False)
        lighthouse.shutdown()

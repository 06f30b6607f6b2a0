"""Single-process fallback."""

from __future__ import annotations

import pytest

from multigpu.env import ClusterEnv, single
from multigpu.errors import EnvError


def test_defaults() -> None:
    env = single.from_environ({"PATH": "/bin"})
    assert env == ClusterEnv(
        source="single",
        rank=0,
        local_rank=0,
        world_size=1,
        local_world_size=1,
        node_rank=0,
        num_nodes=1,
        master_addr="127.0.0.1",
        master_port=29500,
    )
    assert env.is_main and not env.is_distributed


def test_master_variables_honoured() -> None:
    env = single.from_environ({"MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "1234"})
    assert (env.master_addr, env.master_port) == ("10.0.0.5", 1234)


@pytest.mark.parametrize("port", ["0", "65536", "abc"])
def test_bad_master_port(port: str) -> None:
    with pytest.raises(EnvError, match="MASTER_PORT"):
        single.from_environ({"MASTER_PORT": port})

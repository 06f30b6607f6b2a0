"""Fixtures for multi-node tests: test hosts in network namespaces (root only, else skipped)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from multigpu.testing.hosts import Host, hosts_available, virtual_hosts


@pytest.fixture
def two_hosts() -> Iterator[list[Host]]:
    """Two hosts, ``node0`` and ``node1``, on a private bridge; removed after the test."""
    reason = hosts_available()
    if reason is not None:
        pytest.skip(reason)
    with virtual_hosts(2) as hosts:
        yield hosts

"""Replica groups (``multigpu run --replicas R``): per-step fault tolerance on torchft.

A worker of one group: ``settings`` (what the launcher told it), ``coordinator`` (quorum, heal,
commit, on torchft's ``Manager``), ``shares`` (a training loader's share of each global batch),
``hook`` (how it attaches to the Context). torchft is imported only when a group starts.
"""

from __future__ import annotations

from multigpu.replicas.settings import ReplicaSettings, read_replicas

__all__ = ["ReplicaSettings", "read_replicas"]

"""One check at start-up that every rank runs the same software.

Ranks with different torch (or Python, or multigpu) versions can pickle differently, pick
different collective algorithms or bucket gradients differently, and then hang or diverge far
from the cause. Every rank shares its versions once, right after the process group is created,
and a mismatch stops every rank with the same message naming the hosts.

Environment variables read: none.
"""

from __future__ import annotations

import importlib.metadata
import platform
import socket
from typing import Any

import torch

from multigpu import dist
from multigpu.errors import EnvError


def local_versions() -> dict[str, str]:
    """This process's torch, Python and multigpu versions.

    Example:
        >>> sorted(local_versions())
        ['multigpu', 'python', 'torch']
    """
    try:
        ours = importlib.metadata.version("multigpu")
    except importlib.metadata.PackageNotFoundError:
        ours = "unknown"
    return {"torch": torch.__version__, "python": platform.python_version(), "multigpu": ours}


def mismatch_message(found: list[dict[str, Any]]) -> str | None:
    """The error for ranks whose versions differ, or None when all agree.

    Example:
        >>> a = {"host": "n1", "versions": {"torch": "2.13.0"}}
        >>> b = {"host": "n2", "versions": {"torch": "2.12.1"}}
        >>> print(mismatch_message([a, b]))  # doctest: +NORMALIZE_WHITESPACE
        ranks run different software: torch 2.13.0 on rank 0 (n1), 2.12.1 on rank 1 (n2);
        install the same versions on every node
    """
    problems = []
    for name in found[0]["versions"]:
        values = [f["versions"].get(name) for f in found]
        if len(set(values)) > 1:
            groups: dict[str, list[str]] = {}
            for rank, (value, f) in enumerate(zip(values, found, strict=True)):
                groups.setdefault(str(value), []).append(f"rank {rank} ({f['host']})")
            problems.append(
                f"{name} " + ", ".join(f"{v} on {', '.join(where)}" for v, where in groups.items())
            )
    if not problems:
        return None
    return (
        "ranks run different software: "
        + "; ".join(problems)
        + "; install the same versions on every node"
    )


def check_same_versions() -> None:
    """Compare every rank's versions (one small all-gather); raise EnvError on a mismatch."""
    if dist.world_size() < 2:
        return
    found = dist.gather_objects_small({"host": socket.gethostname(), "versions": local_versions()})
    message = mismatch_message(found)
    if message is not None:
        raise EnvError(message)

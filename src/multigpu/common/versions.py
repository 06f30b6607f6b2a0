"""The software a process runs, and the message when ranks or nodes run different software.

Ranks with different torch (or Python, or multigpu) versions can pickle differently, pick
different collective algorithms or bucket gradients differently, and then hang or diverge far
from the cause. Two checks use this: every worker shares its versions once, right after the
process group is created (``multigpu.init``), and every node's ``multigpu run`` shares its own
after each rendezvous, before any worker starts (``multigpu.launch.agent.start_agreement``); a
mismatch stops them all with the same message naming the hosts. No collectives here, so the
launcher, which never creates a process group, can import it.
"""

from __future__ import annotations

import importlib.metadata
import platform
from typing import Any

import torch


def local_versions() -> dict[str, str]:
    """This process's torch, Python and multigpu versions."""
    try:
        ours = importlib.metadata.version("multigpu")
    except importlib.metadata.PackageNotFoundError:
        ours = "unknown"
    return {"torch": torch.__version__, "python": platform.python_version(), "multigpu": ours}


def mismatch_message(found: list[dict[str, Any]], who: str = "rank") -> str | None:
    """The error for ranks (or nodes: ``who="node"``) whose versions differ; None when all agree.

    ``found[i]`` is ``{"host": ..., "versions": local_versions()}`` of rank (node) ``i``.

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
                groups.setdefault(str(value), []).append(f"{who} {rank} ({f['host']})")
            problems.append(
                f"{name} " + ", ".join(f"{v} on {', '.join(where)}" for v, where in groups.items())
            )
    if not problems:
        return None
    return (
        f"{who}s run different software: "
        + "; ".join(problems)
        + "; install the same versions on every node"
    )

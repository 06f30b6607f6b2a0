"""LaunchOptions: what the user asked ``multigpu run`` / ``multigpu train`` for, parsed and checked.

torchrun's own options are kept as the user gave them (canonical long spelling → value) so that
they can be passed on to ``torch.distributed.run`` unchanged; multigpu's options (``--gpus``,
``--cpu``, ``--backend``, ``--iface``, ``--timeout``, ``--dry-run``) are fields of their own.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from multigpu.errors import UsageError

Backend = Literal["auto", "nccl", "gloo"]
BACKENDS: tuple[Backend, ...] = ("auto", "nccl", "gloo")

# torchrun options that choose where the rendezvous store lives; with none of them on a single
# node, multigpu adds --standalone (a store on a free port) instead of torchrun's fixed 29500.
RDZV_DESTS = frozenset(
    {
        "standalone",
        "rdzv_backend",
        "rdzv_endpoint",
        "rdzv_id",
        "master_addr",
        "master_port",
        "node_rank",
    }
)


@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    """Everything the user asked for on the command line, before any device is chosen."""

    script: str
    """The training script (a path), or the module with ``-m``, or the program with
    ``--no-python``."""
    script_args: tuple[str, ...] = ()
    """Arguments passed to the script unchanged."""
    gpus: str | None = None
    """``--gpus`` as typed (``auto``, ``N`` or ``i,j``); None when not given."""
    cpu: int | Literal["auto"] | None = None
    """``--cpu N``: N CPU processes on gloo; ``"auto"``: the split ``multigpu bench scaling``
    measured fastest; None when not given."""
    backend: Backend = "auto"
    """``--backend``: the workers' process-group backend (auto: nccl on GPUs, gloo on CPU)."""
    dry_run: bool = False
    """``--dry-run``: print the plan and start nothing."""
    iface: str | None = None
    """``--iface NAME``: the network interface for gloo/NCCL and the agent's address."""
    timeout: float | None = None
    """``--timeout SECONDS``: the bound on every wait (None: ``MULTIGPU_TIMEOUT`` or 300 s)."""
    one_process: bool = False
    """One process sees every chosen GPU (``multigpu train --strategy dp``)."""
    torchrun: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """torchrun options the user gave explicitly: argparse dest → value (nothing defaulted)."""

    def given(self, dest: str) -> bool:
        """True when the user gave the torchrun option ``dest`` (e.g. ``"nproc_per_node"``)."""
        return dest in self.torchrun

    def get(self, dest: str, default: Any = None) -> Any:
        """The value of torchrun option ``dest`` as given, else ``default``."""
        return self.torchrun.get(dest, default)

    @property
    def is_module(self) -> bool:
        """True with ``-m``: ``script`` is a module name, not a path."""
        return bool(self.get("module", False))

    @property
    def max_nodes(self) -> int:
        """The most nodes ``--nnodes`` allows (``2`` for ``--nnodes 1:2``)."""
        return parse_nnodes(str(self.get("nnodes", "1")))[1]


def parse_nnodes(text: str) -> tuple[int, int]:
    """Parse torchrun's ``--nnodes`` (``N`` or ``MIN:MAX``) into ``(min, max)``."""
    parts = text.split(":")
    try:
        low, high = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (0, -1)
    except ValueError:
        low, high = 0, -1
    if not 0 < low <= high:
        raise UsageError(
            f"--nnodes {text!r} is not a number of nodes; expected N or MIN:MAX with "
            "0 < MIN <= MAX, e.g. --nnodes 2 or --nnodes 1:4"
        )
    return low, high


def torchrun_argv(given: Mapping[str, Any], actions: Iterable[argparse.Action]) -> list[str]:
    """Turn torchrun options (dest → value, as in ``LaunchOptions.torchrun``) back into an
    argument list for ``torch.distributed.run``.

    Each option is written in its canonical long form (``--nproc-per-node=2``), flags alone.
    """
    out: list[str] = []
    for action in actions:
        if not action.option_strings or action.dest not in given:
            continue
        long = max(action.option_strings, key=lambda s: (s.startswith("--"), "-" in s[2:]))
        value = given[action.dest]
        if action.nargs == 0:  # a flag (check_env / store_true)
            if value:
                out.append(long)
        elif isinstance(value, list):  # --duplicate-*-filters: comma list, ",," escapes ","
            out.append(f"{long}={','.join(str(v).replace(',', ',,') for v in value)}")
        else:
            out.append(f"{long}={value}")
    return out

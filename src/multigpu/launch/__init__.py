"""The launcher: plans a launch and runs it on top of torch.distributed.run (the command line
that calls it is ``multigpu.cli``).

Only errors, log, env, host, gpus and torch.distributed.run are imported from here (an
import-linter contract keeps it so); nothing in the library imports launch/.

Environment variables read: see ``multigpu.launch.run``.

Example:
    >>> from multigpu.launch import LaunchOptions, prepare
    >>> with prepare(LaunchOptions(script="train.py", cpu=2)) as plan:  # doctest: +SKIP
    ...     print(plan.describe())
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from multigpu.launch.options import LaunchOptions
    from multigpu.launch.plan import DeviceRequest, LaunchPlan, build_plan, request_devices
    from multigpu.launch.run import launch, multigpu_run, prepare

# Imported on first use: the command line validates its input before anything heavy loads.
_WHERE = {
    "LaunchOptions": "multigpu.launch.options",
    "DeviceRequest": "multigpu.launch.plan",
    "LaunchPlan": "multigpu.launch.plan",
    "build_plan": "multigpu.launch.plan",
    "request_devices": "multigpu.launch.plan",
    "launch": "multigpu.launch.run",
    "prepare": "multigpu.launch.run",
    "multigpu_run": "multigpu.launch.run",
}

__all__ = [
    "DeviceRequest",
    "LaunchOptions",
    "LaunchPlan",
    "build_plan",
    "launch",
    "multigpu_run",
    "prepare",
    "request_devices",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'multigpu.launch' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value

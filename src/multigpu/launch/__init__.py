"""The launcher: ``multigpu run|train|gpus`` on top of torch.distributed.run.

Only errors, log, env, gpus and torch.distributed.run are imported from here (an import-linter
contract keeps it so); nothing in the library imports launch/.

Environment variables read: see ``multigpu.launch.run`` and ``multigpu.launch.cli``.

Example:
    >>> from multigpu.launch import main
    >>> main(["run", "--cpu", "2", "--dry-run", "train.py"])  # doctest: +SKIP
    0
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from multigpu.launch.cli import main
    from multigpu.launch.options import LaunchOptions
    from multigpu.launch.plan import DeviceRequest, LaunchPlan, build_plan, choose_devices
    from multigpu.launch.run import launch, prepare, run_command

# Imported on first use: the command line validates its input before anything heavy loads.
_WHERE = {
    "main": "multigpu.launch.cli",
    "LaunchOptions": "multigpu.launch.options",
    "DeviceRequest": "multigpu.launch.plan",
    "LaunchPlan": "multigpu.launch.plan",
    "build_plan": "multigpu.launch.plan",
    "choose_devices": "multigpu.launch.plan",
    "launch": "multigpu.launch.run",
    "prepare": "multigpu.launch.run",
    "run_command": "multigpu.launch.run",
}

__all__ = [
    "DeviceRequest",
    "LaunchOptions",
    "LaunchPlan",
    "build_plan",
    "choose_devices",
    "launch",
    "main",
    "prepare",
    "run_command",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'multigpu.launch' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value

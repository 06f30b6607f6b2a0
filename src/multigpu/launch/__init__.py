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

from multigpu.launch.cli import main
from multigpu.launch.options import LaunchOptions
from multigpu.launch.plan import DeviceRequest, LaunchPlan, build_plan, choose_devices
from multigpu.launch.run import launch, prepare, run_command

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

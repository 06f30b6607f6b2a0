"""What a command runs — a script path or a module for ``-m`` — checked before anything starts.

``multigpu run``, ``verify`` and ``bench scaling`` all take a script or ``-m module``; one check
here, so a directory, a missing file and an unknown package are said the same way everywhere.
"""

from __future__ import annotations

import importlib.util
import os

from multigpu.errors import UsageError


def check_script(script: str) -> None:
    """Raise UsageError unless ``script`` is a file (said differently for a directory)."""
    where = "" if os.path.isabs(script) else f" (relative to {os.getcwd()})"
    if os.path.isdir(script):
        example = os.path.join(script, "train.py")
        raise UsageError(
            f"script {script!r} is a directory{where}; expected a Python file such as "
            f"{example}; check the path, or use -m for a module"
        )
    if not os.path.isfile(script):
        raise UsageError(
            f"script {script!r} does not exist{where}; expected a Python file; check the path, "
            "or use -m for a module"
        )


def check_module(module: str) -> None:
    """Raise UsageError unless ``module``'s top-level package can be found on ``sys.path``.

    Only the top-level package is looked up: finding a submodule would import its parents
    (user code) in the launcher.
    """
    top = module.split(".", 1)[0]
    if not module or importlib.util.find_spec(top) is None:
        raise UsageError(
            f"module {module!r} was not found (no package {top!r} on sys.path); expected an "
            "importable module for -m; check the name or install the package"
        )

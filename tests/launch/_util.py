"""Helpers for the launcher tests: run ``python -m multigpu`` as a child process."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The test's environment with PYTHONPATH=src, which the workers inherit too."""
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    env["GLOO_SOCKET_IFNAME"] = "lo"
    # On a GPU machine each test worker locks the GPUs in its own directory: tests running side
    # by side would otherwise find the GPUs "locked by another job" (each other).
    env.setdefault(
        "MULTIGPU_LOCK_DIR",
        os.path.join(tempfile.gettempdir(), f"multigpu-test-locks-{os.getpid()}"),
    )
    env.update(extra or {})
    return env


def popen_multigpu(argv: Sequence[str], cwd: Path, **extra_env: str) -> subprocess.Popen[str]:
    """Start ``python -m multigpu ARGV`` in ``cwd``; the caller collects it."""
    return subprocess.Popen(
        [sys.executable, "-m", "multigpu", *argv],
        cwd=cwd,
        env=child_env(extra_env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def run_multigpu(
    argv: Sequence[str], cwd: Path, timeout: float = 120, **extra_env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m multigpu ARGV`` to the end (killed after ``timeout`` seconds)."""
    proc = popen_multigpu(argv, cwd, **extra_env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"multigpu {' '.join(argv)} ran over {timeout} s:\n{err}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

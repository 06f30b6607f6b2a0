"""Nothing outlives the launcher: workers die with it, and what a killed one left is cleared.

- ``guard_workers`` rewrites the parsed ``torch.distributed.run`` arguments so that every worker
  starts through ``worker_guard.py`` (``PR_SET_PDEATHSIG``: the kernel kills the worker when the
  launcher dies, even by SIGKILL, which no handler of torch's agent can see).
- ``trace_directory`` makes the launch's temporary directory (the workers' collective traces)
  with the launcher's pid in its name, and first removes those of launchers that are dead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from multigpu.launch import worker_guard

TRACE_PREFIX = "multigpu-trace-"


def guard_workers(args: Any, environ: dict[str, str] | Any) -> None:
    """Make torchrun's parsed ``args`` start each worker through the worker guard (in place).

    ``python -u [-m] SCRIPT ARGS`` becomes ``python -I -S worker_guard.py python -u [-m] SCRIPT
    ARGS`` (and ``--no-python PROGRAM ARGS`` likewise), which ``exec``s the original command after
    ``prctl``: the worker keeps the pid and arguments it would have had. ``--run-path`` workers
    are functions in processes torch's multiprocessing starts, out of this reach (left as they
    are). Sets ``MULTIGPU_AGENT_PID`` in ``environ`` (the environment the workers inherit).
    """
    if getattr(args, "run_path", False):
        return
    python = os.getenv("PYTHON_EXEC", sys.executable)  # what torch.distributed.run would run
    if args.no_python:
        command = [args.training_script]
    else:
        command = [python, "-u", *(["-m"] if args.module else []), args.training_script]
    args.training_script_args = [
        "-I",
        "-S",
        worker_guard.__file__,
        *command,
        *args.training_script_args,
    ]
    args.training_script = sys.executable
    args.no_python, args.module = True, False
    environ[worker_guard.AGENT_PID_VARIABLE] = str(os.getpid())


@contextlib.contextmanager
def trace_directory() -> Iterator[str]:
    """A temporary directory for this launch's traces, removed at the end; those that killed
    launchers left behind (their pid is in the name and no longer alive) are removed first."""
    remove_dead_launchers_traces(Path(tempfile.gettempdir()))
    with tempfile.TemporaryDirectory(prefix=f"{TRACE_PREFIX}{os.getpid()}-") as path:
        yield path


def remove_dead_launchers_traces(root: Path) -> list[Path]:
    """Remove ``root``'s trace directories whose launcher is no longer alive. Returns them."""
    removed = []
    for path in root.glob(f"{TRACE_PREFIX}*-*"):
        pid = path.name[len(TRACE_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit() or _alive(int(pid)) or not _ours(path):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: nothing is sent, only the existence is checked
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def _ours(path: Path) -> bool:
    try:
        return path.is_dir() and path.stat().st_uid == os.getuid()
    except OSError:
        return False

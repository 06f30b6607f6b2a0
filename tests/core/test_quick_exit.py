"""A process that ran multigpu (a worker, the launcher) skips the collector's last pass at exit."""

from __future__ import annotations

import subprocess
import sys

# The line printed by an exit handler registered before multigpu's (handlers run last-in,
# first-out, so it runs after it): the objects left for the last pass, and whether a cycle's
# __del__ (never promised at exit) still ran.
SCRIPT = """
import atexit, gc, sys
atexit.register(lambda: print("frozen", gc.get_freeze_count() > 10000, flush=True))
{body}
"""


def _last_line(body: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(body=body)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_init_and_the_command_leave_the_exit_without_the_last_collection() -> None:
    init = "import multigpu\nwith multigpu.init(seed=0):\n    pass"
    command = "from multigpu.cli.main import main\nmain(['gpus'])"
    assert _last_line(init) == "frozen True"
    assert _last_line(command) == "frozen True"  # without: gc.get_freeze_count() == 0

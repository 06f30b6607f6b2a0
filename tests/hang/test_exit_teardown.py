"""A finished worker exits 0: no thread of multigpu is inside torch's code at finalization."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent / "scripts"
SRC = Path(__file__).resolve().parents[2] / "src"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    return env


def test_a_watchdog_in_a_store_call_at_exit_is_waited_for_not_aborted() -> None:
    server = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "store_server.py")],
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        worker = subprocess.Popen(
            [sys.executable, str(SCRIPTS / "watchdog_at_exit.py"), port, str(server.pid)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == "stopping"
        time.sleep(0.3)  # the script is in watchdog.stop(), or (before the fix) finalizing
        os.kill(server.pid, signal.SIGCONT)
        out, err = worker.communicate(timeout=60)
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.kill()
        server.wait()
    assert "terminate called" not in err, err
    assert worker.returncode == 0, err  # before the fix: -6 (SIGABRT)
    assert out.strip() == "stopped=True"  # the thread ended once its store call returned

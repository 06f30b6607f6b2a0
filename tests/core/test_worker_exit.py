"""A worker of ``multigpu run`` ends quietly on Ctrl-C and on a refused input (worker_exit).

Each case is a child interpreter that imports ``multigpu`` (no torch) with the variables its
launcher would give it; no launcher runs.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from tests.launch._util import child_env


def _worker(code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    variables = {
        "MULTIGPU_AGENT_PID": "1",
        "LOCAL_RANK": "0",
        "RANK": "0",
        "TORCHELASTIC_ERROR_FILE": str(tmp_path / "error.json"),
        **env,
    }
    return subprocess.run(
        [sys.executable, "-c", code], env=child_env(variables), capture_output=True, text=True,
        timeout=60, cwd=tmp_path,
    )  # fmt: skip


def test_a_usage_error_before_init_is_recorded_not_printed(tmp_path: Path) -> None:
    # As FSDPStrategy(mesh_shape="tp=2") raises, in the argument of multigpu.init().
    done = _worker("import multigpu\nraise multigpu.UsageError('mesh_shape: bad')", tmp_path)
    assert done.returncode == 1 and done.stderr == ""  # the launcher says it, exit 2
    entry = json.loads((tmp_path / "error.json").read_text())["multigpu"]
    assert entry["usage"] and entry["message"] == "mesh_shape: bad"


def test_other_errors_keep_their_traceback(tmp_path: Path) -> None:
    done = _worker("import multigpu\nraise ValueError('boom')", tmp_path)
    assert done.returncode == 1 and "Traceback" in done.stderr and "ValueError: boom" in done.stderr


def test_ctrl_c_is_one_line_on_rank_0_and_nothing_on_the_others(tmp_path: Path) -> None:
    code = "import os, signal, multigpu\nos.kill(os.getpid(), signal.SIGINT)\nimport time\n" \
        "time.sleep(5)"  # fmt: skip
    zero = _worker(code, tmp_path)
    one = _worker(code, tmp_path, RANK="1")
    assert zero.returncode == one.returncode == -signal.SIGINT  # as Python ends on Ctrl-C
    assert zero.stderr == "multigpu: rank 0 stopped by Ctrl-C (SIGINT); no checkpoint was saved\n"
    assert one.stderr == ""


def test_the_scripts_own_keyboard_interrupt_handling_runs(tmp_path: Path) -> None:
    code = (
        "import os, signal, time, multigpu\n"
        "try:\n    os.kill(os.getpid(), signal.SIGINT); time.sleep(5)\n"
        "except KeyboardInterrupt:\n    print('saved by the script')\n"
    )
    done = _worker(code, tmp_path)
    assert done.returncode == 0 and done.stdout == "saved by the script\n"


def test_plain_torchrun_workers_are_left_alone(tmp_path: Path) -> None:
    done = _worker("import multigpu\nraise multigpu.UsageError('bad')", tmp_path,
                   MULTIGPU_AGENT_PID="")  # fmt: skip
    assert "Traceback" in done.stderr


def test_ctrl_c_names_the_checkpoint_at_once_even_if_the_process_is_killed_before_its_exit(
    tmp_path: Path,
) -> None:
    # A second Ctrl-C: torch's agent leaves while it waits, and the kernel kills the workers
    # (PR_SET_PDEATHSIG, SIGKILL) before their exit handlers run.
    code = (
        "import os, signal, time, multigpu\n"
        "from multigpu.common import worker_exit\n"
        "worker_exit.note_checkpoints('ck', lambda: 'last checkpoint: ck/step-00000003 (step 3)')\n"
        "try:\n    os.kill(os.getpid(), signal.SIGINT); time.sleep(5)\n"
        "finally:\n    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = _worker(code, tmp_path)
    assert done.returncode == -signal.SIGKILL
    assert done.stderr == (
        "multigpu: rank 0 stopped by Ctrl-C (SIGINT); last checkpoint: ck/step-00000003 (step 3)\n"
    )


def test_a_checkpoint_saved_by_the_scripts_own_handling_is_named_again_at_exit(
    tmp_path: Path,
) -> None:
    code = (
        "import os, signal, time, multigpu\n"
        "from multigpu.common import worker_exit\n"
        "said = ['last checkpoint: ck/step-00000003 (step 3)']\n"
        "worker_exit.note_checkpoints('ck', lambda: said[-1])\n"
        "try:\n    os.kill(os.getpid(), signal.SIGINT); time.sleep(5)\n"
        "except KeyboardInterrupt:\n    said.append('last checkpoint: ck/step-00000004 (step 4)')\n"
    )
    done = _worker(code, tmp_path)
    assert done.stderr.splitlines() == [
        "multigpu: rank 0 stopped by Ctrl-C (SIGINT); last checkpoint: ck/step-00000003 (step 3)",
        "multigpu: rank 0 stopped by Ctrl-C (SIGINT); last checkpoint: ck/step-00000004 (step 4)",
    ]

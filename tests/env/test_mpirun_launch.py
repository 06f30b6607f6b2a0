"""``mpirun -np 2 python script.py``: Open MPI starts the ranks, multigpu reads its variables.

Runs where Open MPI's ``mpirun`` is installed (Debian: ``apt-get install openmpi-bin``; ``.ci/run``
installs it when it can) and is skipped with the reason otherwise.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.launch._util import child_env, run_multigpu

ROOT = Path(__file__).resolve().parents[2]
MPIRUN = shutil.which("mpirun")


@pytest.mark.skipif(MPIRUN is None, reason="Open MPI's mpirun is not installed")
def test_mpirun_two_ranks_train_like_multigpu_run(tmp_path: Path) -> None:
    env = child_env({"OMP_NUM_THREADS": "1"})
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    for name in ("PYTHONPATH", "GLOO_SOCKET_IFNAME", "OMP_NUM_THREADS"):
        env.setdefault(name, "")
    done = subprocess.run(
        [str(MPIRUN), "--oversubscribe", "-np", "2",
         "-x", "PYTHONPATH", "-x", "GLOO_SOCKET_IFNAME", "-x", "OMP_NUM_THREADS",
         sys.executable, str(ROOT / "examples" / "minimal.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    epochs = [ln for ln in done.stdout.splitlines() if ln.startswith("epoch")]
    assert len(epochs) == 3  # rank 0 only: multigpu saw two MPI ranks, not two lone processes
    alone = run_multigpu(["run", "--cpu", "2", str(ROOT / "examples" / "minimal.py")], tmp_path)
    assert epochs == [ln for ln in alone.stdout.splitlines() if ln.startswith("epoch")]

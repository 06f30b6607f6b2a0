"""A real one-node SLURM cluster (Debian's slurm-wlm + munge), started and stopped by the test.

Runs as root where ``slurmctld``, ``slurmd``, ``munged`` and ``srun`` are installed (``.ci/run``
installs them when it can) and is skipped with the reason otherwise. Everything lives in a
temporary directory: its own munge key and socket, its own slurm.conf and free ports; the
daemons run in the foreground as children of the test and are stopped by pid afterwards.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.launch._util import child_env, run_multigpu

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = ROOT / "examples" / "minimal.py"
NEEDED = ("slurmctld", "slurmd", "munged", "srun", "sbatch", "sinfo")
MISSING = [name for name in NEEDED if shutil.which(name) is None]
REASON = (
    f"not installed: {', '.join(MISSING)}" if MISSING
    else "needs root (slurmd)" if os.geteuid() != 0 else ""
)  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _conf(d: Path, host: str) -> str:
    return f"""ClusterName=multigpu-test
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge.sock
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
NodeName={host} CPUs={os.cpu_count()} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    if REASON:
        pytest.skip(REASON)
    d = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool"):
        (d / sub).mkdir()
    key = d / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    munged = [
        "munged", "--foreground", "--force", f"--socket={d}/munge.sock", f"--key-file={key}",
        f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log", f"--seed-file={d}/seed",
    ]  # fmt: skip
    conf = d / "slurm.conf"
    conf.write_text(_conf(d, socket.gethostname()))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    daemons: list[subprocess.Popen[bytes]] = []
    try:
        for argv in (munged, ["slurmctld", "-D", "-c", "-f", str(conf)],
                     ["slurmd", "-D", "-f", str(conf)]):  # fmt: skip
            daemons.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL))  # fmt: skip
            time.sleep(0.5)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            state = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True,
                                   text=True, check=False).stdout.strip()  # fmt: skip
            if state == "idle":
                break
            time.sleep(0.5)
        else:
            pytest.skip(
                f"the test cluster did not come up: {(d / 'slurmd.log').read_text()[-500:]}"
            )
        yield {"SLURM_CONF": str(conf)}
    finally:
        for proc in reversed(daemons):  # only the daemons this fixture started
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    done = run_multigpu(["run", "--cpu", "2", str(MINIMAL)], tmp_path_factory.mktemp("ref"))
    return [ln for ln in done.stdout.splitlines() if ln.startswith("epoch")]


def _srun(cluster: dict[str, str], argv: list[str], cwd: Path) -> list[str]:
    env = child_env(cluster | {"OMP_NUM_THREADS": "1"})
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=180,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return [ln for ln in done.stdout.splitlines() if ln.startswith("epoch")]


def test_srun_tasks_are_the_ranks(cluster: dict[str, str], reference: list[str],
                                  tmp_path: Path) -> None:  # fmt: skip
    import sys

    assert _srun(cluster, ["srun", "-n", "2", sys.executable, str(MINIMAL)], tmp_path) == reference


def test_srun_multigpu_run_starts_the_workers(cluster: dict[str, str], reference: list[str],
                                              tmp_path: Path) -> None:  # fmt: skip
    import sys

    argv = ["srun", "-n", "1", sys.executable, "-m", "multigpu", "run", "--cpu", "2", str(MINIMAL)]
    assert _srun(cluster, argv, tmp_path) == reference


def test_the_sbatch_script_of_multigpu_slurm_runs(cluster: dict[str, str], reference: list[str],
                                                  tmp_path: Path) -> None:  # fmt: skip
    import sys

    script = tmp_path / "job.sbatch"
    made = run_multigpu(["slurm", "--nodes", "1", "--cpu", "2", "-o", str(script), str(MINIMAL)],
                        tmp_path)  # fmt: skip
    assert made.returncode == 0, made.stderr
    # The job runs `multigpu` from PATH: put this interpreter's first.
    env = child_env(cluster | {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    done = subprocess.run(["sbatch", "--wait", str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (out,) = tmp_path.glob("minimal-*.out")
    assert [ln for ln in out.read_text().splitlines() if ln.startswith("epoch")] == reference

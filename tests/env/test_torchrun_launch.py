"""The real ``torch.distributed.run`` launches two workers; each detects its own position."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

WORKER = """
import dataclasses, json, os, sys
from multigpu.env import detect
env = detect(os.environ)
# One write per line: workers share the pipe and print unbuffered.
sys.stdout.write("DETECTED " + json.dumps(dataclasses.asdict(env)) + "\\n")
"""

_FOREIGN = ("SLURM_", "OMPI_", "PMI_", "MV2_", "MPI_LOCAL", "TORCHELASTIC_", "PMIX_")
_NAMES = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
}


def test_real_torchrun_two_workers(tmp_path: Path, python: str) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    # Whatever launched pytest (srun, mpirun) must not leak into the workers' environment.
    child_env = {
        k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN) and k not in _NAMES
    }
    child_env |= {"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            python,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(script),
        ],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = [
        json.loads(line.split(" ", 1)[1])
        for line in proc.stdout.splitlines()
        if line.startswith("DETECTED ")
    ]
    by_rank = {env["rank"]: env for env in found}
    assert sorted(by_rank) == [0, 1], proc.stdout
    for rank, env in by_rank.items():
        assert env["source"] == "torchrun"
        assert (env["world_size"], env["local_rank"], env["local_world_size"]) == (2, rank, 2)
        assert (env["node_rank"], env["num_nodes"], env["restart_count"]) == (0, 1, 0)
        assert env["master_addr"] and 1 <= env["master_port"] <= 65535
    assert by_rank[0]["master_addr"] == by_rank[1]["master_addr"]
    assert by_rank[0]["master_port"] == by_rank[1]["master_port"]

"""The doctor in a pod or on a SkyPilot node (issue 39): the engine's variables are named with
what `multigpu run` takes from them, and a rendezvous host that does not resolve is a FAIL."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from multigpu.common.host import read_interfaces
from multigpu.diagnostics.doctor.engine import engine_rows

POD = {
    "KUBERNETES_SERVICE_HOST": "10.96.0.1", "PET_NNODES": "2", "PET_NODE_RANK": "1",
    "PET_NPROC_PER_NODE": "8", "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": "29500",
}  # fmt: skip


def test_a_pod_is_named_with_its_node_and_rendezvous_and_the_host_is_checked() -> None:
    engine, rendezvous = engine_rows(POD, read_interfaces())
    assert engine.status == "OK" and engine.value.startswith(
        "a Kubernetes pod (torchrun PET_* variables): node 1 of 2, rendezvous 127.0.0.1:29500; "
        "`multigpu run` takes them (PET_MASTER_ADDR, PET_MASTER_PORT, PET_NNODES, PET_NODE_RANK, "
        "PET_NPROC_PER_NODE)"
    )
    assert rendezvous.status == "OK" and rendezvous.value == "127.0.0.1 -> 127.0.0.1 (this machine)"
    gone = engine_rows({**POD, "PET_MASTER_ADDR": "job-node-0-0.no-such-service.invalid"}, [])
    assert gone[1].status == "FAIL" and "does not resolve" in gone[1].value
    assert "headless service" in gone[1].fix


def test_skypilot_and_bad_values_and_nothing() -> None:
    sky = {
        "SKYPILOT_NUM_NODES": "2",
        "SKYPILOT_NODE_RANK": "0",
        "SKYPILOT_NODE_IPS": "127.0.0.1\n10.9.9.9",
    }
    rows = engine_rows(sky, read_interfaces())
    assert rows[0].value.startswith(
        "a SkyPilot node (SkyPilot's SKYPILOT_* variables): node 0 of 2, rendezvous 127.0.0.1:29500"
    )
    bad = engine_rows({**POD, "PET_NODE_RANK": "x"}, [])
    assert len(bad) == 1 and bad[0].status == "FAIL" and "PET_NODE_RANK" in bad[0].value
    assert engine_rows({"HOME": "/root"}, []) == []


def test_the_doctor_shows_them_in_a_pod() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "multigpu", "doctor", "--json"],
        env={**os.environ, **POD, "PET_MASTER_ADDR": "no-such-pod.invalid"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    rows = {r["name"]: r for r in json.loads(done.stdout)["checks"]}
    assert rows["engine"]["status"] == "OK", done.stdout
    assert rows["engine rendezvous"]["status"] == "FAIL"
    assert done.returncode == 1

"""Pods started as the operators start them: two test hosts named like a job's pods, each running
the manifest's command with the manifest's variables plus those the operator adds, train like one
node. Root only (test hosts are network namespaces on a private bridge); skipped otherwise.

The operators' variables are written down here from their source (Kubeflow Trainer v2.3.0
``pkg/runtime/framework/plugins/torch/torch.go``; Training Operator v1.9
``pkg/controller.v1/pytorch/{envvar,master,elastic}.go``), since no operator runs here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from multigpu.cli.main import main
from multigpu.testing.hosts import Host, hosts_available, virtual_hosts
from tests.launch._util import run_multigpu
from tests.multinode._util import HUNG, TRAIN, host_env, wait_all

NAME = "mgk8s"


def manifest(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    """The job document ``multigpu k8s`` prints for ``argv``."""
    assert main(["k8s", *argv]) == 0
    job: dict[str, Any] = next(yaml.safe_load_all(capsys.readouterr().out))
    return job


def trainjob_pods(job: dict[str, Any]) -> list[tuple[str, list[str], dict[str, str]]]:
    """(hostname, command, variables) of each pod of a TrainJob on the torch runtime."""
    trainer = job["spec"]["trainer"]
    name = job["metadata"]["name"]
    pods = []
    for index in range(trainer["numNodes"]):
        env = {e["name"]: e["value"] for e in trainer.get("env", [])}
        env.update(
            PET_NNODES=str(trainer["numNodes"]),
            PET_NPROC_PER_NODE=str(trainer["numProcPerNode"]),
            PET_NODE_RANK=str(index),  # the Job's completion index
            PET_MASTER_ADDR=f"{name}-node-0-0.{name}",  # pod 0 behind the headless service
            PET_MASTER_PORT="29500",
        )
        pods.append((f"{name}-node-0-{index}.{name}", trainer["command"], env))
    return pods


def pytorchjob_pods(job: dict[str, Any]) -> list[tuple[str, list[str], dict[str, str]]]:
    """(hostname, command, variables) of each pod of a PyTorchJob (Master + Workers)."""
    name = job["metadata"]["name"]
    specs = job["spec"]["pytorchReplicaSpecs"]
    nproc = job["spec"]["nprocPerNode"]
    replicas = [("master", 0)] + [("worker", i) for i in range(specs.get("Worker", {}).get(
        "replicas", 0))]  # fmt: skip
    nodes = len(replicas)
    pods = []
    for rank, (kind, index) in enumerate(replicas):
        container = specs[kind.capitalize()]["template"]["spec"]["containers"][0]
        port = str(container["ports"][0]["containerPort"])
        env = {e["name"]: e["value"] for e in container.get("env", [])}
        env.update(
            PYTHONUNBUFFERED="1",
            MASTER_ADDR=f"{name}-master-0",
            PET_MASTER_ADDR=f"{name}-master-0",
            MASTER_PORT=port,
            PET_MASTER_PORT=port,
            WORLD_SIZE=str(nodes * int(nproc)),
            RANK=str(rank),
            PET_NODE_RANK=str(rank),
            PET_NPROC_PER_NODE=nproc,
            PET_NNODES=str(nodes),
        )
        pods.append((f"{name}-{kind}-{index}", container["command"], env))
    return pods


@pytest.fixture
def pod_hosts(request: pytest.FixtureRequest) -> Iterator[list[Host]]:
    reason = hosts_available()
    if reason is not None:
        pytest.skip(reason)
    with virtual_hosts(2, names=request.param) as hosts:
        yield hosts


def _image_env(extra: dict[str, str]) -> dict[str, str]:
    """The "image": this checkout's Python and multigpu on PATH, the pod's variables on top."""
    env = host_env()
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(extra)
    return env


def _params(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.mark.parametrize(
    ("kind", "pod_hosts"),
    [
        ("trainjob", [f"{NAME}-node-0-0.{NAME}", f"{NAME}-node-0-1.{NAME}"]),
        ("pytorchjob", [f"{NAME}-master-0", f"{NAME}-worker-0"]),
    ],
    indirect=["pod_hosts"],
)
def test_two_pods_train_like_one_node(
    kind: str, pod_hosts: list[Host], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reference = tmp_path / "one_node.pt"
    done = run_multigpu(["run", "--cpu", "2", TRAIN, str(reference)], tmp_path, OMP_NUM_THREADS="1")
    assert done.returncode == 0, done.stderr

    out = tmp_path / "pods.pt"
    job = manifest(capsys, TRAIN, str(out), "--nodes", "2", "--cpu", "1", "--image", "img",
                   "--kind", kind, "--name", NAME, "--timeout", "60")  # fmt: skip
    pods = trainjob_pods(job) if kind == "trainjob" else pytorchjob_pods(job)
    assert [p[0] for p in pods] == [h.name for h in pod_hosts]
    procs = []
    for (_, command, env), host in zip(pods, pod_hosts, strict=True):
        with (tmp_path / f"{host.name}.log").open("wb") as log:
            procs.append(host.run(command, _image_env(env), cwd=tmp_path, stdout=log,
                                  stderr=subprocess.STDOUT))  # fmt: skip
    ended = wait_all(procs, timeout=HUNG)
    logs = [(tmp_path / f"{h.name}.log").read_text() for h in pod_hosts]
    assert None not in ended, logs
    assert [p.returncode for p in procs] == [0, 0], logs
    assert "step 6 on 2 ranks (2 nodes)" in logs[0], logs
    for r, log in enumerate(logs):  # each pod said which variables made it node r of 2
        assert f"multigpu: node {r} of 2 from the environment (PET_NNODES=2" in log, log
    one, two = _params(reference), _params(out)
    assert list(one) == list(two)
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=0, atol=1e-5)

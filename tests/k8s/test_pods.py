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
import time
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


@pytest.fixture(scope="module")
def one_node(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The parameters ``multigpu run --cpu 2`` ends with on one node (made once per module)."""
    where = tmp_path_factory.mktemp("one-node")
    done = run_multigpu(["run", "--cpu", "2", TRAIN, str(where / "one_node.pt")], where,
                        OMP_NUM_THREADS="1")  # fmt: skip
    assert done.returncode == 0, done.stderr
    return where / "one_node.pt"


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
    kind: str,
    pod_hosts: list[Host],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    one_node: Path,
) -> None:
    reference = one_node

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


RESUME = str(Path(__file__).resolve().parent / "scripts" / "resume.py")


def elastic_pytorchjob_pods(job: dict[str, Any]) -> list[tuple[str, list[str], dict[str, str]]]:
    """(hostname, command, variables) of each pod of an elastic PyTorchJob (Workers only)."""
    name = job["metadata"]["name"]
    policy = job["spec"]["elasticPolicy"]
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    container = worker["template"]["spec"]["containers"][0]
    port = container["ports"][0]["containerPort"]
    env = {e["name"]: e["value"] for e in container.get("env", [])}
    env.update(
        PYTHONUNBUFFERED="1",
        PET_RDZV_ENDPOINT=f"{name}-worker-0:{port}",  # worker 0 hosts the c10d store
        PET_RDZV_BACKEND=policy["rdzvBackend"],
        PET_NNODES=f"{policy['minReplicas']}:{policy['maxReplicas']}",
        PET_MAX_RESTARTS=str(policy["maxRestarts"]),
        PET_RDZV_ID=policy["rdzvId"],
        PET_NPROC_PER_NODE=job["spec"]["nprocPerNode"],
    )
    return [
        (f"{name}-worker-{i}", container["command"], dict(env)) for i in range(worker["replicas"])
    ]


@pytest.mark.parametrize("pod_hosts", [[f"{NAME}-worker-0", f"{NAME}-worker-1"]], indirect=True)
def test_elastic_pytorchjob_loses_a_pod_and_resumes_from_its_checkpoint(
    pod_hosts: list[Host], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reference = tmp_path / "uninterrupted.pt"
    done = run_multigpu(["run", "--cpu", "2", RESUME, str(tmp_path / "ref-ckpt"), str(reference)],
                        tmp_path, OMP_NUM_THREADS="1")  # fmt: skip
    assert done.returncode == 0, done.stderr

    ckpt, out = tmp_path / "ckpt", tmp_path / "pods.pt"  # the shared volume (--pvc on a cluster)
    job = manifest(capsys, RESUME, str(ckpt), str(out), "--sleep", "0.1", "--kind", "pytorchjob",
                   "--nnodes", "1:2", "--cpu", "1", "--max-restarts", "1", "--image", "img",
                   "--name", NAME, "--timeout", "15")  # fmt: skip
    pods = elastic_pytorchjob_pods(job)
    logs = [tmp_path / f"{h.name}.log" for h in pod_hosts]
    procs = []
    for (_, command, env), host, log in zip(pods, pod_hosts, logs, strict=True):
        with log.open("wb") as fh:
            procs.append(host.run(command, _image_env(env), cwd=tmp_path, stdout=fh,
                                  stderr=subprocess.STDOUT))  # fmt: skip
    began = time.monotonic()
    while not list(ckpt.glob("*/COMMITTED")):  # a checkpoint of the 2-pod job is complete
        assert time.monotonic() - began < HUNG, [log.read_text()[-2000:] for log in logs]
        assert all(p.poll() is None for p in procs), [log.read_text()[-2000:] for log in logs]
        time.sleep(0.1)
    assert pod_hosts[1].kill_all()  # the node of pod 1 is lost: every process of it
    ended = wait_all(procs[:1], timeout=HUNG)
    text = logs[0].read_text()
    assert ended[0] is not None and procs[0].returncode == 0, text[-4000:]
    print(f"pod 1 lost -> pod 0 finished alone {ended[0]:.1f} s later")
    assert "on 2 ranks" in text and "resumed at step" in text, text[-4000:]
    assert "resumed at step 0" not in text and " on 1 ranks" in text, text[-4000:]
    one, two = _params(reference), _params(out)
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=0, atol=1e-5)

"""Kubernetes manifests that run a script with ``multigpu run`` on every pod of a job.

Two operators run PyTorch jobs on Kubernetes, and both set torchrun's ``PET_*`` variables in each
pod (read by ``multigpu run``: ``multigpu.launch.engine_topology``), so the pods' command is the
same plain ``multigpu run [--timeout T] SCRIPT ARGS`` on every node:

- Kubeflow Trainer's ``TrainJob`` (``trainer.kubeflow.org/v1alpha1``) on the ``torch-distributed``
  runtime: one pod per node (a JobSet whose pods are ``NAME-node-0-I``), ``PET_NNODES``,
  ``PET_NPROC_PER_NODE`` (``numProcPerNode``), ``PET_NODE_RANK`` (the pod's index),
  ``PET_MASTER_ADDR=NAME-node-0-0.NAME`` and ``PET_MASTER_PORT=29500``
  (``pkg/runtime/framework/plugins/torch/torch.go``, v2.3.0). The pod template is patched
  through ``runtimePatches`` (volumes, mounts).
- The Training Operator's ``PyTorchJob`` (``kubeflow.org/v1``): a Master and N-1 Workers,
  ``PET_NNODES``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR=NAME-master-0``, ``PET_MASTER_PORT``
  (the container's ``pytorchjob-port``), and for an elastic job (``elasticPolicy``) Workers only
  with ``PET_RDZV_BACKEND=c10d``, ``PET_RDZV_ENDPOINT=NAME-worker-0:PORT``,
  ``PET_NNODES=MIN:MAX``, ``PET_MAX_RESTARTS`` (``pkg/controller.v1/pytorch``, v1.9).

Each manifest comes with a ``NetworkPolicy``: the job's pods accept connections only from the
job's own pods, since torch's store has no authentication and gloo/NCCL connect on ephemeral
ports (``jobset.sigs.k8s.io/jobset-name`` labels a TrainJob's pods, ``training.kubeflow.org/
job-name`` a PyTorchJob's). With a PersistentVolumeClaim the checkpoints go to its mount in every
pod, said in the manifest's first comment and the job's ``multigpu/checkpoints`` annotation.

The YAML is written here (``to_yaml``): a handful of plain types, no YAML library needed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Literal

from multigpu.errors import UsageError

Kind = Literal["trainjob", "pytorchjob"]
KINDS: tuple[Kind, ...] = ("trainjob", "pytorchjob")

TRAINJOB_PORT = 29500
"""Kubeflow Trainer's ``ContainerTrainerPort``: node 0's rendezvous store."""
PYTORCHJOB_PORT = 23456
"""The Training Operator's default ``pytorchjob-port``: the master's (or worker 0's) store."""
GPU_RESOURCE = "nvidia.com/gpu"
CHECKPOINT_ANNOTATION = "multigpu/checkpoints"
TRAINJOB_POD_LABEL = "jobset.sigs.k8s.io/jobset-name"
PYTORCHJOB_POD_LABEL = "training.kubeflow.org/job-name"
_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
NAME_MAX = 40
"""Longest job name: pod names add ``-node-0-12-abcde`` (JobSet) within Kubernetes' 63."""


@dataclass(frozen=True, kw_only=True)
class K8sJob:
    """What ``multigpu k8s`` was asked for, checked (``check``) before any manifest is made."""

    script: str
    """The training script, as the image sees it (a path inside the container)."""
    script_args: tuple[str, ...] = ()
    """Its arguments, unchanged."""
    image: str
    """The container image: Python, torch and multigpu installed, the script inside."""
    name: str
    """The job's name (a DNS label of at most 40 characters)."""
    nodes: int
    """Pods (nodes); for an elastic PyTorchJob the most of them (``MAX`` of ``--nnodes``)."""
    min_nodes: int | None = None
    """Elastic PyTorchJob only: the fewest nodes the job goes on with (``MIN``)."""
    gpus_per_node: int = 0
    """GPUs per pod (``nvidia.com/gpu``), one worker process each; 0 for CPU pods."""
    cpu: int = 1
    """Worker processes per CPU pod (with ``gpus_per_node`` 0)."""
    cpus_per_node: str | None = None
    """CPU cores asked per pod (``resources``), e.g. ``"8"`` or ``"7500m"``."""
    memory: str | None = None
    """Memory asked per pod, e.g. ``"64Gi"``."""
    kind: Kind = "trainjob"
    """``trainjob`` (Kubeflow Trainer) or ``pytorchjob`` (Training Operator, kubeflow.org/v1)."""
    namespace: str | None = None
    """The namespace of every object (None: kubectl's current one)."""
    pvc: str | None = None
    """A PersistentVolumeClaim (ReadWriteMany) mounted in every pod for checkpoints."""
    mount: str = "/checkpoints"
    """Where the claim is mounted."""
    runtime: str = "torch-distributed"
    """TrainJob only: the ClusterTrainingRuntime referenced."""
    max_restarts: int = 0
    """Restarts of a node's workers (``--max-restarts``; PyTorchJob: ``maxRestarts``)."""
    timeout: float | None = None
    """``multigpu run --timeout`` in the pods (None: its default)."""

    @property
    def elastic(self) -> bool:
        """True for an elastic PyTorchJob (``--nnodes MIN:MAX``)."""
        return self.min_nodes is not None

    @property
    def procs_per_node(self) -> int:
        """Worker processes per pod: one per GPU, else ``cpu``."""
        return self.gpus_per_node or self.cpu

    @property
    def port(self) -> int:
        """The rendezvous store's port on node 0 (or worker 0)."""
        return TRAINJOB_PORT if self.kind == "trainjob" else PYTORCHJOB_PORT

    @property
    def pod_label(self) -> tuple[str, str]:
        """The label (key, value) the operator puts on every pod of this job."""
        return (TRAINJOB_POD_LABEL if self.kind == "trainjob" else PYTORCHJOB_POD_LABEL, self.name)


def default_name(script: str) -> str:
    """A job name from the script's file name: ``train_gpt.py`` → ``train-gpt``.

    Example:
        >>> default_name("examples/My_Train.py")
        'my-train'
    """
    stem = PurePosixPath(script).stem.lower()
    name = re.sub(r"[^a-z0-9-]+", "-", stem).strip("-")
    name = re.sub(r"^[^a-z]+", "", name)[:NAME_MAX].rstrip("-")
    return name or "multigpu"


def check(job: K8sJob) -> None:
    """Refuse what no cluster would run, in one line each.

    Raises:
        UsageError: a bad name, namespace, mount, image, node count, or options of one kind
            given to the other.
    """
    if not _NAME.match(job.name) or len(job.name) > NAME_MAX:
        raise UsageError(
            f"--name {job.name!r} is not a job name; expected lowercase letters, digits and '-', "
            f"starting with a letter, at most {NAME_MAX} characters; e.g. --name train-gpt"
        )
    if job.namespace is not None and (not _NAME.match(job.namespace) or len(job.namespace) > 63):
        raise UsageError(
            f"--namespace {job.namespace!r} is not a namespace name; expected a DNS label "
            "(lowercase letters, digits, '-'); e.g. --namespace team-a"
        )
    if job.pvc is not None and not re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", job.pvc):
        raise UsageError(
            f"--pvc {job.pvc!r} is not a PersistentVolumeClaim name; expected a DNS name "
            "(lowercase letters, digits, '-', '.'); e.g. --pvc checkpoints"
        )
    if not job.mount.startswith("/") or ":" in job.mount:
        raise UsageError(
            f"--mount {job.mount!r} is not a path in the container; expected an absolute path "
            "without ':'; e.g. --mount /checkpoints"
        )
    if not job.image or any(c.isspace() for c in job.image):
        raise UsageError(
            f"--image {job.image!r} is not an image reference; expected e.g. "
            "--image registry.example/team/train:1"
        )
    if job.elastic and job.kind != "pytorchjob":
        raise UsageError(
            f"--nnodes {job.min_nodes}:{job.nodes} asks for an elastic job, which Kubeflow "
            "Trainer's TrainJob has not; expected --kind pytorchjob with it, or --nodes N"
        )
    if job.gpus_per_node and job.cpu != 1:
        raise UsageError(
            f"--cpu {job.cpu} with --gpus-per-node {job.gpus_per_node}: expected one of them; "
            "use --gpus-per-node for GPU nodes, --cpu N for CPU-only nodes"
        )


def manifests(job: K8sJob) -> list[dict[str, Any]]:
    """The job (TrainJob or PyTorchJob) and its NetworkPolicy, as Kubernetes objects.

    Example:
        >>> job = K8sJob(script="train.py", image="img:1", name="train", nodes=2, gpus_per_node=8)
        >>> [m["kind"] for m in manifests(job)]
        ['TrainJob', 'NetworkPolicy']
        >>> manifests(job)[0]["spec"]["trainer"]["numNodes"]
        2
    """
    check(job)
    made = trainjob(job) if job.kind == "trainjob" else pytorchjob(job)
    return [made, network_policy(job)]


def pod_command(job: K8sJob) -> list[str]:
    """What every pod runs: ``multigpu run``, which reads the operator's ``PET_*`` variables."""
    timeout = ["--timeout", _number(job.timeout)] if job.timeout is not None else []
    # An elastic PyTorchJob says its restarts in PET_MAX_RESTARTS (elasticPolicy.maxRestarts).
    restarts = ["--max-restarts", str(job.max_restarts)] if job.max_restarts else []
    return ["multigpu", "run", *([] if job.elastic else restarts), *timeout, job.script,
            *job.script_args]  # fmt: skip


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _metadata(job: K8sJob, name: str, *, annotate: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if job.namespace is not None:
        meta["namespace"] = job.namespace
    meta["labels"] = {"app.kubernetes.io/managed-by": "multigpu"}
    if annotate and job.pvc is not None:
        meta["annotations"] = {CHECKPOINT_ANNOTATION: job.mount}
    return meta


def _resources(job: K8sJob) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    requests: dict[str, Any] = {}
    if job.gpus_per_node:
        limits[GPU_RESOURCE] = job.gpus_per_node  # extended resources: limits (= requests)
    if job.cpus_per_node is not None:
        requests["cpu"] = limits["cpu"] = job.cpus_per_node
    if job.memory is not None:
        requests["memory"] = limits["memory"] = job.memory
    out: dict[str, Any] = {}
    if limits:
        out["limits"] = limits
    if requests:
        out["requests"] = requests
    return out


def _volumes(job: K8sJob) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    # /dev/shm: a container's is 64 MiB, too small for NCCL's and DataLoader workers' buffers.
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if job.pvc is not None:
        volumes.append({"name": "checkpoints", "persistentVolumeClaim": {"claimName": job.pvc}})
        mounts.append({"name": "checkpoints", "mountPath": job.mount})
    return volumes, mounts


def trainjob(job: K8sJob) -> dict[str, Any]:
    """The Kubeflow Trainer ``TrainJob`` (``trainer.kubeflow.org/v1alpha1``)."""
    volumes, mounts = _volumes(job)
    trainer: dict[str, Any] = {
        "image": job.image,
        "command": pod_command(job),
        "numNodes": job.nodes,
        "numProcPerNode": job.procs_per_node,
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
    }
    resources = _resources(job)
    if resources:
        trainer["resourcesPerNode"] = resources
    pod_spec = {"volumes": volumes, "containers": [{"name": "node", "volumeMounts": mounts}]}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": _metadata(job, job.name, annotate=True),
        "spec": {
            "runtimeRef": {
                "name": job.runtime,
                "apiGroup": "trainer.kubeflow.org",
                "kind": "ClusterTrainingRuntime",
            },
            "trainer": trainer,
            "runtimePatches": [
                {
                    "manager": "multigpu",
                    "trainingRuntimeSpec": {
                        "template": {
                            "spec": {
                                "replicatedJobs": [
                                    {
                                        "name": "node",
                                        "template": {
                                            "spec": {"template": {"spec": pod_spec}},
                                        },
                                    }
                                ]
                            }
                        }
                    },
                }
            ],
        },
    }


def pytorchjob(job: K8sJob) -> dict[str, Any]:
    """The Training Operator's ``PyTorchJob`` (``kubeflow.org/v1``), elastic with ``min_nodes``."""
    volumes, mounts = _volumes(job)
    container: dict[str, Any] = {
        "name": "pytorch",  # the operator finds the port and sets the variables by this name
        "image": job.image,
        "command": pod_command(job),
        "ports": [{"name": "pytorchjob-port", "containerPort": job.port}],
        "volumeMounts": mounts,
    }
    resources = _resources(job)
    if resources:
        container["resources"] = resources

    def replica(count: int) -> dict[str, Any]:
        return {
            "replicas": count,
            "restartPolicy": "OnFailure",
            "template": {"spec": {"containers": [container], "volumes": volumes}},
        }

    spec: dict[str, Any] = {"nprocPerNode": str(job.procs_per_node)}
    if job.elastic:
        # Workers only: the c10d rendezvous at worker 0 gives node ranks; pods come and go.
        spec["elasticPolicy"] = {
            "rdzvBackend": "c10d",
            "rdzvId": job.name,
            "minReplicas": job.min_nodes,
            "maxReplicas": job.nodes,
            "maxRestarts": job.max_restarts,
        }
        spec["pytorchReplicaSpecs"] = {"Worker": replica(job.nodes)}
    else:
        replicas = {"Master": replica(1)}
        if job.nodes > 1:
            replicas["Worker"] = replica(job.nodes - 1)
        spec["pytorchReplicaSpecs"] = replicas
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": _metadata(job, job.name, annotate=True),
        "spec": spec,
    }


def network_policy(job: K8sJob) -> dict[str, Any]:
    """A ``NetworkPolicy``: the job's pods accept connections from the job's own pods only
    (the rendezvous store, the workers' store, gloo/NCCL on ephemeral ports)."""
    key, value = job.pod_label
    own = {"matchLabels": {key: value}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(job, f"{job.name}-own-pods-only"),
        "spec": {
            "podSelector": own,
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": own}]}],
        },
    }


def header(job: K8sJob) -> list[str]:
    """The comment lines above the manifests: what they are, where checkpoints go, how to apply."""
    what = "Kubeflow Trainer TrainJob" if job.kind == "trainjob" else "Kubeflow PyTorchJob"
    nodes = f"{job.min_nodes}:{job.nodes}" if job.elastic else str(job.nodes)
    devices = f"{job.gpus_per_node} GPU(s)" if job.gpus_per_node else f"{job.cpu} CPU process(es)"
    if job.pvc is not None:
        where = (
            f"checkpoints: write them under {job.mount} (PersistentVolumeClaim {job.pvc}, "
            "ReadWriteMany, mounted in every pod)"
        )
    else:
        where = "checkpoints: no --pvc, so they stay on each pod's own disk and die with it"
    return [
        where,
        f"{what} {job.name}: {nodes} node(s) x {devices}, each pod runs `multigpu run`",
        "and a NetworkPolicy: the job's pods accept connections from its own pods only",
        "made by `multigpu k8s`; apply with: kubectl apply -f FILE",
    ]


_PLAIN = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./@-]*$")
_YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"}


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    text = str(value)
    if _PLAIN.match(text) and text.lower() not in _YAML_WORDS:
        return text
    return json.dumps(text)  # a JSON string is a YAML double-quoted scalar


def _emit(value: Any, indent: int, out: list[str]) -> None:
    pad = " " * indent
    if isinstance(value, Mapping):
        for key, item in value.items():
            k = _scalar(key)
            if isinstance(item, (Mapping, list)) and item:
                out.append(f"{pad}{k}:")
                _emit(item, indent + (2 if isinstance(item, Mapping) else 0), out)
            else:
                out.append(f"{pad}{k}: {_flow(item)}")
    else:
        for item in value:
            if isinstance(item, (Mapping, list)) and item:
                sub: list[str] = []
                _emit(item, indent + 2, sub)
                out.append(f"{pad}- {sub[0][indent + 2 :]}")
                out.extend(sub[1:])
            else:
                out.append(f"{pad}- {_flow(item)}")


def _flow(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _scalar(value)


def to_yaml(documents: Sequence[Mapping[str, Any]], comments: Sequence[str] = ()) -> str:
    """YAML documents (``---`` between them), after ``# comment`` lines.

    Example:
        >>> print(to_yaml([{"a": [1, {"b": "x y"}], "c": {}}], ["hi"]), end="")
        # hi
        a:
        - 1
        - b: "x y"
        c: {}
    """
    lines = [f"# {c}" for c in comments]
    for i, doc in enumerate(documents):
        if i:
            lines.append("---")
        _emit(doc, 0, lines)
    return "\n".join(lines) + "\n"

"""``multigpu k8s``: a Kubeflow ``TrainJob`` (or ``PyTorchJob``) and its ``NetworkPolicy`` that run
a script with ``multigpu run`` on every pod (``multigpu.launch.kubernetes``).

``multigpu k8s SCRIPT [ARGS] --nodes N --gpus-per-node G --image IMAGE``: the options of
``multigpu k8s`` may stand before or after the script; everything else after the script is
the script's, and everything after ``--`` is the script's whatever its name.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from multigpu.cli.args import parse_script_command
from multigpu.cli.output_file import print_or_write
from multigpu.common.arguments import Parser, seconds_arg, whole_arg
from multigpu.errors import UsageError
from multigpu.launch import kubernetes
from multigpu.launch.options import parse_nnodes


def build_parser() -> argparse.ArgumentParser:
    """The ``multigpu k8s`` parser."""
    p = Parser(
        prog="multigpu k8s",
        description="Write a Kubernetes job that runs SCRIPT with `multigpu run` on every pod: a "
        "Kubeflow Trainer TrainJob (torch runtime), or a PyTorchJob with --kind pytorchjob, "
        "and a NetworkPolicy that admits only the job's own pods. Options may stand before or "
        "after SCRIPT; the script's arguments that have the name of one go after `--`.",
    )
    p.add_argument("--image", required=True, help="container image with torch, multigpu, script")
    p.add_argument("--nodes", type=whole_arg(1), help="pods (nodes) of the job")
    p.add_argument(
        "--nnodes",
        metavar="MIN:MAX",
        help="--kind pytorchjob: an elastic job going on with MIN to MAX nodes (elasticPolicy)",
    )
    p.add_argument("--gpus-per-node", type=whole_arg(0), default=0, help="GPUs per pod (0: CPU)")
    p.add_argument("--cpu", type=whole_arg(1), help="CPU processes per pod (--gpus-per-node 0)")
    p.add_argument("--cpus-per-node", metavar="CORES", help="CPU cores per pod, e.g. 8 or 7500m")
    p.add_argument("--memory", metavar="SIZE", help="memory per pod, e.g. 64Gi")
    p.add_argument(
        "--kind",
        choices=kubernetes.KINDS,
        default="trainjob",
        help="trainjob (Kubeflow Trainer, trainer.kubeflow.org/v1alpha1; default) or pytorchjob "
        "(Kubeflow Training Operator, kubeflow.org/v1)",
    )
    p.add_argument("--name", help="job name (default: from the script's file name)")
    p.add_argument("--namespace", help="namespace of the job (default: kubectl's current)")
    p.add_argument(
        "--pvc",
        metavar="CLAIM",
        help="PersistentVolumeClaim (ReadWriteMany) mounted in every pod for checkpoints",
    )
    p.add_argument("--mount", default="/checkpoints", help="where --pvc is mounted (/checkpoints)")
    p.add_argument(
        "--runtime",
        default="torch-distributed",
        help="TrainJob: the ClusterTrainingRuntime (default torch-distributed)",
    )
    p.add_argument("--max-restarts", type=whole_arg(0), default=0, help="restarts per node agent")
    p.add_argument(
        "--timeout", type=seconds_arg, metavar="SECONDS", help="`multigpu run --timeout` in pods"
    )
    p.add_argument("-o", "--out", metavar="FILE", help="write the manifest here (default: stdout)")
    p.add_argument("--force", action="store_true", help="overwrite --out")
    p.add_argument("script", help="the training script, as the image sees it")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    return p


def job_from(ns: argparse.Namespace, script_args: Sequence[str]) -> kubernetes.K8sJob:
    """The checked ``K8sJob`` of parsed options."""
    min_nodes: int | None = None
    if ns.nnodes is not None:
        low, high = parse_nnodes(ns.nnodes)
        if ns.nodes is not None and ns.nodes != high:
            raise UsageError(
                f"--nodes {ns.nodes} and --nnodes {ns.nnodes} disagree; expected one of them; "
                "use --nnodes MIN:MAX alone for an elastic job"
            )
        nodes = high
        min_nodes = low if low != high or ns.kind == "pytorchjob" else None
    elif ns.nodes is not None:
        nodes = ns.nodes
    else:
        raise UsageError(
            "no node count was given; expected --nodes N (or --nnodes MIN:MAX with --kind "
            "pytorchjob); e.g. --nodes 2"
        )
    if ns.cpu is not None and ns.gpus_per_node:  # even --cpu 1, which check() cannot tell
        raise UsageError(
            f"--cpu {ns.cpu} with --gpus-per-node {ns.gpus_per_node}: expected one of them; "
            "use --gpus-per-node for GPU nodes, --cpu N for CPU-only nodes"
        )
    job = kubernetes.K8sJob(
        script=ns.script,
        script_args=tuple(script_args),
        image=ns.image,
        name=ns.name if ns.name is not None else kubernetes.default_name(ns.script),
        nodes=nodes,
        min_nodes=min_nodes,
        gpus_per_node=ns.gpus_per_node,
        cpu=ns.cpu or 1,
        cpus_per_node=ns.cpus_per_node,
        memory=ns.memory,
        kind=ns.kind,
        namespace=ns.namespace,
        pvc=ns.pvc,
        mount=ns.mount,
        runtime=ns.runtime,
        max_restarts=ns.max_restarts,
        timeout=ns.timeout,
    )
    kubernetes.check(job)
    return job


def k8s_main(argv: Sequence[str]) -> int:
    """Entry point of ``multigpu k8s``; returns the exit code."""
    parsed = parse_script_command(build_parser(), argv)
    if parsed is None:
        return 0  # --help
    ns, script_args = parsed
    job = job_from(ns, [*ns.args, *script_args])
    text = kubernetes.to_yaml(kubernetes.manifests(job), kubernetes.header(job))
    out = print_or_write(text, ns.out, force=ns.force)
    if out is not None:
        print(f"wrote {out}; apply it with: kubectl apply -f {out}")
    return 0

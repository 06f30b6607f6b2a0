"""``multigpu sky``: write the SkyPilot task YAML that runs a script with ``multigpu run`` on every
node of a SkyPilot cluster (the YAML's shape: ``multigpu.launch.skypilot``)."""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from multigpu.cli.args import parse_script_command
from multigpu.cli.output_file import print_or_write
from multigpu.common.arguments import Parser, whole_arg
from multigpu.errors import UsageError
from multigpu.launch.skypilot import DEFAULT_PORT, Accelerators, Mount, SkyTask, check_script


def _installed_versions() -> tuple[str, str]:
    """torch's and multigpu's versions here, as pip pins them on the nodes (torch without a
    local build tag such as ``+cpu``: the nodes take the default, CUDA, wheel)."""
    from importlib.metadata import PackageNotFoundError, version

    import multigpu

    try:
        torch_version = version("torch").split("+", 1)[0]
    except PackageNotFoundError:  # pragma: no cover - multigpu depends on torch
        torch_version = ""
    torch_spec = f"torch=={torch_version}" if torch_version else "torch"
    return torch_spec, f"multigpu=={multigpu.__version__}"


def _multigpu_spec(workdir: Path) -> str:
    """``-e .`` when ``workdir`` is a multigpu source tree (SkyPilot copies it to the nodes, so
    they run this very code), else this version of multigpu from the package index."""
    try:
        project = (workdir / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        project = ""
    if re.search(r'^name\s*=\s*"multigpu"', project, flags=re.M):
        return "-e ."
    return _installed_versions()[1]


def build_parser() -> argparse.ArgumentParser:
    """The ``multigpu sky`` parser."""
    torch_spec, multigpu_spec = _installed_versions()
    p = Parser(
        prog="multigpu sky",
        description="Write a SkyPilot task YAML that runs SCRIPT with `multigpu run` on every "
        "node of the cluster, with SkyPilot's node rank and IPs as the rendezvous "
        "(launch it with `sky launch -c CLUSTER FILE`).",
    )
    p.add_argument("--nodes", type=whole_arg(1), required=True, help="nodes (num_nodes)")
    p.add_argument(
        "--gpus",
        metavar="NAME[:COUNT]",
        help="accelerators per node as SkyPilot names them, e.g. A100:8 (one worker per GPU); "
        "without it, CPU nodes",
    )
    p.add_argument(
        "--cpu", type=whole_arg(1), help="CPU processes per node (without --gpus; default 1)"
    )
    p.add_argument("--name", help="task name (default: the script's name)")
    p.add_argument(
        "--workdir",
        default=".",
        help="folder SkyPilot copies to each node and runs in; SCRIPT is relative to it "
        "(default: .)",
    )
    p.add_argument(
        "--port",
        type=whole_arg(1),
        default=DEFAULT_PORT,
        help=f"rendezvous port on node 0 (default {DEFAULT_PORT})",
    )
    p.add_argument("--max-restarts", type=whole_arg(0), default=0, help="restarts per node agent")
    p.add_argument(
        "--mount",
        action="append",
        default=[],
        metavar="PATH=SOURCE",
        help="file_mounts entry: a bucket (s3://..., gs://...) mounted at PATH, written through "
        "(checkpoints that outlive the cluster), or a local folder copied there; repeatable",
    )
    p.add_argument(
        "--torch", default=torch_spec, help=f"what setup pip-installs for torch ({torch_spec})"
    )
    p.add_argument(
        "--install",
        help=f"what setup pip-installs for multigpu (default: -e . when --workdir is a "
        f"multigpu checkout, else {multigpu_spec}; or a wheel in the workdir, a git URL)",
    )
    p.add_argument(
        "--setup",
        action="append",
        default=[],
        metavar="CMD",
        help="another setup command after the installs (e.g. 'pip install -r "
        "requirements.txt'); repeatable",
    )
    p.add_argument("-o", "--out", help="write the YAML here, atomically (default: stdout)")
    p.add_argument("--force", action="store_true", help="overwrite --out")
    p.add_argument(
        "script",
        help="the training script, relative to --workdir (options of "
        "multigpu sky may also follow it; the script's own that share a name go "
        "after --)",
    )
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    return p


def task_from(ns: argparse.Namespace) -> SkyTask:
    """The task of the parsed options; a one-line UsageError for what cannot run."""
    accelerators = Accelerators.parse(ns.gpus) if ns.gpus is not None else None
    if accelerators and ns.cpu:
        raise UsageError(
            f"--cpu {ns.cpu} with --gpus {ns.gpus}: expected one of them; use --gpus for GPU "
            "nodes, --cpu for CPU-only nodes"
        )
    if ns.port > 65535:
        raise UsageError(f"--port {ns.port} is not valid; expected a TCP port 1-65535")
    check_script(ns.script)
    workdir = Path(ns.workdir)
    if not (workdir / ns.script).is_file():
        raise UsageError(
            f"script {ns.script!r} is not in --workdir {ns.workdir!r} ({workdir / ns.script} "
            "is not a file); expected SCRIPT relative to the folder SkyPilot copies to the nodes"
        )
    return SkyTask(
        script=ns.script,
        script_args=tuple(ns.args),
        nodes=ns.nodes,
        accelerators=accelerators,
        cpu_processes=ns.cpu or 1,
        name=ns.name or Path(ns.script).stem,
        workdir=ns.workdir,
        port=ns.port,
        max_restarts=ns.max_restarts,
        torch_spec=ns.torch,
        multigpu_spec=ns.install or _multigpu_spec(workdir),
        setup=tuple(ns.setup),
        mounts=tuple(Mount.parse(m) for m in ns.mount),
    )


def sky_main(argv: Sequence[str]) -> int:
    """Entry point of ``multigpu sky``; returns the exit code.

    Its options may stand before or after the script (``multigpu sky train.py --nodes 2``), as
    ``multigpu k8s``'s; the script's own arguments that share a name with one go after ``--``.
    """
    parsed = parse_script_command(build_parser(), argv)
    if parsed is None:
        return 0  # --help
    ns, script_args = parsed
    ns.args = [*ns.args, *script_args]
    text = task_from(ns).to_yaml()  # every check before anything is written
    out = print_or_write(text, ns.out, force=ns.force)
    if out is not None:
        print(f"wrote {out}; launch it with: sky launch -c CLUSTER {shlex.quote(str(out))}")
    return 0

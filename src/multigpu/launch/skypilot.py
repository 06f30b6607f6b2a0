"""SkyPilot task YAML: one ``multigpu run`` per node of a SkyPilot cluster.

SkyPilot starts the task's ``run`` commands on every node at once and gives each its place in
the job as variables: ``SKYPILOT_NODE_RANK`` (0..N-1), ``SKYPILOT_NUM_NODES`` and
``SKYPILOT_NODE_IPS`` (every node's IP, one a line, node 0 first). The run line passes them to
``multigpu run`` as torchrun's static-rendezvous flags (``--nnodes``, ``--node-rank``,
``--master-addr``, ``--master-port``), so the job does not depend on which variables the
launcher itself would read. Node 0's store listens on the cluster's own network, which SkyPilot
keeps to the cluster's nodes.

Written by hand, not by a YAML library: the task is a fixed shape of a few strings, each scalar
JSON-quoted (valid YAML) and ``setup``/``run`` as literal blocks, so it stays readable and needs
nothing installed; SkyPilot's own loader (``sky.Task.from_yaml``) reads it in the tests.

Environment variables read: none here (the task reads SkyPilot's, on the nodes).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from multigpu.errors import UsageError

DEFAULT_PORT = 29500
"""The rendezvous port on node 0 (torchrun's default)."""

_ACCELERATOR = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")
_CLOUD_STORE = re.compile(r"[a-z0-9]+://")


@dataclass(frozen=True, kw_only=True)
class Accelerators:
    """A SkyPilot accelerator request, ``NAME:COUNT`` per node.

    Example:
        >>> Accelerators.parse("A100:8")
        Accelerators(name='A100', count=8)
    """

    name: str
    """SkyPilot's accelerator name (``A100``, ``H100``, ``A100-80GB``, ``L4``...)."""
    count: int
    """Accelerators per node: one ``multigpu run`` worker each."""

    @classmethod
    def parse(cls, text: str) -> Accelerators:
        """``NAME`` (one) or ``NAME:COUNT``; a one-line UsageError for anything else."""
        name, _, count = text.partition(":")
        if not _ACCELERATOR.fullmatch(name) or (count and not count.isdigit()) or count == "0":
            raise UsageError(
                f"--gpus {text!r} is not valid; expected NAME:COUNT with a whole COUNT >= 1 "
                "GPUs per node, as SkyPilot names them (e.g. --gpus A100:8, --gpus H100:8, "
                "--gpus L4)"
            )
        return cls(name=name, count=int(count or 1))

    def __str__(self) -> str:
        return f"{self.name}:{self.count}"


@dataclass(frozen=True, kw_only=True)
class Mount:
    """A ``file_mounts`` entry: ``PATH`` on each node from ``SOURCE``.

    Example:
        >>> Mount.parse("/checkpoints=s3://team-bucket/run1")
        Mount(path='/checkpoints', source='s3://team-bucket/run1')
    """

    path: str
    """Where it appears on each node (absolute, or under ``~``)."""
    source: str
    """A bucket URI (``s3://``, ``gs://``, ``r2://``...: mounted, written through) or a local
    path (copied to each node at launch)."""

    @classmethod
    def parse(cls, text: str) -> Mount:
        """``PATH=SOURCE``; a one-line UsageError for anything else."""
        path, _, source = text.partition("=")
        if not source or not (path.startswith("/") or path.startswith("~")):
            raise UsageError(
                f"--mount {text!r} is not valid; expected PATH=SOURCE with an absolute PATH on "
                "the nodes, e.g. --mount /checkpoints=s3://bucket/run (a bucket, mounted) or "
                "--mount /data=./data (a local folder, copied)"
            )
        return cls(path=path, source=source)

    @property
    def is_bucket(self) -> bool:
        """True when ``source`` is a cloud store's URI (mounted rather than copied)."""
        return bool(_CLOUD_STORE.match(self.source))


@dataclass(frozen=True, kw_only=True)
class SkyTask:
    """What ``multigpu sky`` writes: the task of ``nodes`` nodes running ``script`` there."""

    script: str
    """The training script, relative to ``workdir`` (SkyPilot syncs it to each node)."""
    script_args: Sequence[str] = ()
    """The script's own arguments."""
    nodes: int
    """Nodes (``num_nodes``)."""
    accelerators: Accelerators | None = None
    """GPUs per node; None: CPU nodes running ``cpu_processes`` workers each."""
    cpu_processes: int = 1
    """Workers per CPU node (``multigpu run --cpu N``) when there are no accelerators."""
    name: str
    """The task's name."""
    workdir: str = "."
    """The folder SkyPilot copies to each node (``~/sky_workdir``), where ``run`` starts."""
    port: int = DEFAULT_PORT
    """The rendezvous port on node 0."""
    max_restarts: int = 0
    """Restarts per node agent (``multigpu run --max-restarts``)."""
    torch_spec: str
    """What ``pip`` installs for torch in ``setup``."""
    multigpu_spec: str
    """What ``pip`` installs for multigpu in ``setup``."""
    setup: Sequence[str] = ()
    """More setup commands, after the installs."""
    mounts: Sequence[Mount] = field(default_factory=tuple)
    """``file_mounts`` (checkpoints in a bucket outlive the cluster)."""

    def run_line(self) -> str:
        """The ``multigpu run`` command each node runs (SkyPilot's variables in it)."""
        devices = (
            ["--gpus", str(self.accelerators.count)]
            if self.accelerators
            else ["--cpu", str(self.cpu_processes)]
        )
        words = ["multigpu", "run", *devices]
        if self.max_restarts:
            words += ["--max-restarts", str(self.max_restarts)]
        quoted = " ".join(shlex.quote(w) for w in [*words])
        script = " ".join(shlex.quote(a) for a in [self.script, *self.script_args])
        if self.nodes == 1:  # one node: its own standalone rendezvous on a free port
            return f"{quoted} {script}"
        topology = (
            '--nnodes "$SKYPILOT_NUM_NODES" --node-rank "$SKYPILOT_NODE_RANK" '
            f'--master-addr "$HEAD_IP" --master-port {self.port}'
        )
        return f"{quoted} {topology} {script}"

    def to_yaml(self) -> str:
        """The task YAML (see the module doc for why it is written by hand)."""
        q = json.dumps  # a JSON string is a YAML double-quoted scalar
        lines = [
            "# Written by `multigpu sky`. Launch: sky launch -c CLUSTER THIS_FILE",
            f"name: {q(self.name)}",
        ]
        if self.accelerators:
            lines += ["resources:", f"  accelerators: {q(str(self.accelerators))}"]
        lines += [f"num_nodes: {self.nodes}", f"workdir: {q(self.workdir)}"]
        if self.mounts:
            lines.append("file_mounts:")
            for m in self.mounts:
                if m.is_bucket:  # written through to the bucket: checkpoints outlive the nodes
                    lines += [f"  {q(m.path)}:", f"    source: {q(m.source)}", "    mode: MOUNT"]
                else:
                    lines.append(f"  {q(m.path)}: {q(m.source)}")
        setup = [
            "set -euo pipefail",
            # torch first and pinned, as scripts/setup does: the CUDA wheel on GPU nodes.
            f"pip install {_words(self.torch_spec)}",
            f"pip install {_words(self.multigpu_spec)}",
            *self.setup,
        ]
        run = ["set -euo pipefail"]
        if self.nodes > 1:
            run += [
                "# SkyPilot gives every node its rank and all nodes' IPs (node 0 first);",
                "# node 0 holds the rendezvous.",
                'HEAD_IP=$(echo "$SKYPILOT_NODE_IPS" | head -n1)',
            ]
        run.append(self.run_line())
        lines += ["setup: |", *_block(setup), "run: |", *_block(run)]
        return "\n".join(lines) + "\n"


def _words(spec: str) -> str:
    """A pip argument as shell words, each quoted (``torch>=2.4`` is not a redirection; ``-e .``
    stays two words)."""
    return " ".join(shlex.quote(w) for w in shlex.split(spec))


def _block(commands: Sequence[str]) -> list[str]:
    """``commands`` as the lines of a YAML literal block (indented; a command's own newlines
    stay in it, indented alike, which YAML takes off again)."""
    return ["  " + line if line else "" for c in commands for line in c.split("\n")]


def check_script(script: str) -> None:
    """Refuse a script SkyPilot would not find on the nodes: ``run`` starts in the synced
    workdir, so the script is given relative to it."""
    path = PurePosixPath(script)
    if path.is_absolute() or ".." in path.parts:
        raise UsageError(
            f"script {script!r} is outside the workdir; expected a path relative to --workdir "
            "(SkyPilot copies that folder to each node and runs there), e.g. train.py"
        )

"""The SLURM source: tasks started by ``srun`` (a job *step*), and SLURM host lists.

Only an srun step makes this process one task among many. A batch script (``sbatch``), an
``salloc`` shell and an interactive shell step also carry ``SLURM_JOB_ID``, ``SLURM_NTASKS`` and
even ``SLURM_PROCID=0``, but they are one process that will start the real tasks itself (with
``srun``, ``torchrun`` or ``mpirun``); reading them as rank 0 of N would hang at rendezvous
waiting for N - 1 processes that never come. How to tell them apart (from Slurm's
``src/common/env.c`` and slurmstepd):

- srun exports ``SLURM_STEP_ID`` / ``SLURM_STEPID`` and ``SLURM_STEP_NUM_TASKS`` etc. to every
  task; a batch script has no step id at all (its step is not exported, or exported as the
  special id 4294967291); salloc's shell has none either.
- ``salloc`` with ``use_interactive_step`` and ``srun --pty bash`` run a shell inside a step;
  they carry ``SLURM_PTY_PORT`` (and the interactive step the special id 4294967290). A Python
  started from that shell is not an srun task, so it is not detected here either (DINO/DeiT's
  ``init_distributed_mode`` uses the same ``SLURM_PTY_PORT`` test; Lightning's guess from
  ``SLURM_JOB_NAME == "bash"`` misfires on batch jobs named bash).

The rendezvous address defaults to the first host of the step's node list (task 0 runs there
under block, cyclic and plane distributions), and the port to ``15000 + (10 * job_id +
step_id) % 17000``: every task computes the same number without talking, two steps running at
once in one job get different ports, and the range 15000..31999 stays below Linux's ephemeral
ports (32768+) that outgoing connections take. Export ``MASTER_ADDR`` / ``MASTER_PORT`` to
override either (e.g. when node names do not resolve, or a port is taken).

Environment variables read: ``SLURM_STEP_ID``, ``SLURM_STEPID``, ``SLURM_PTY_PORT``,
``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID``, ``SLURM_STEP_NUM_TASKS``, ``SLURM_NTASKS``,
``SLURM_NPROCS``, ``SLURM_STEP_NUM_NODES``, ``SLURM_NNODES``, ``SLURM_STEP_TASKS_PER_NODE``,
``SLURM_TASKS_PER_NODE``, ``SLURM_STEP_NODELIST``, ``SLURM_JOB_NODELIST``, ``SLURM_NODELIST``,
``SLURM_JOB_ID``, ``SLURM_JOBID``, ``MASTER_ADDR``, ``MASTER_PORT``.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Mapping

from multigpu.env._common import build, first, master_port, read_int, value
from multigpu.env.types import ClusterEnv
from multigpu.errors import EnvError

log = logging.getLogger(__name__)

SPECIAL_STEP_IDS = 0xFFFFFFF0
"""Step ids from here up are Slurm's pseudo steps (interactive, batch, extern, pending)."""

PORT_BASE = 15000
PORT_SPAN = 17000

FIX = (
    "run the tasks with `srun` (or `srun torchrun`), or export MASTER_ADDR, MASTER_PORT, RANK, "
    "WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE yourself"
)

_STEP_ID = ("SLURM_STEP_ID", "SLURM_STEPID")
# STEP_* first: `srun --preserve-env` leaves SLURM_NTASKS/NNODES/TASKS_PER_NODE at the
# allocation's values, while the STEP_* ones always describe this step.
_WORLD = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
_NODES = ("SLURM_STEP_NUM_NODES", "SLURM_NNODES")
_TASKS_PER_NODE = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
_NODELIST = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
_JOB_ID = ("SLURM_JOB_ID", "SLURM_JOBID")


def step_id(environ: Mapping[str, str]) -> int | None:
    """The id of the srun step this process is a task of, or None outside a real srun step.

    Example:
        >>> step_id({"SLURM_STEP_ID": "0"}), step_id({"SLURM_JOB_ID": "7"})
        (0, None)
        >>> step_id({"SLURM_STEP_ID": "4294967290", "SLURM_PTY_PORT": "3"}) is None  # salloc
        True
    """
    found = read_int(environ, *_STEP_ID, fix=FIX)
    if found is None:
        return None  # batch script, salloc shell, or no SLURM at all
    if found[1] >= SPECIAL_STEP_IDS:
        log.debug("SLURM pseudo step %s=%d is not an srun task; ignoring SLURM", *found)
        return None
    if value(environ, "SLURM_PTY_PORT") is not None:
        log.debug("SLURM step with a pty (srun --pty shell); ignoring SLURM")
        return None
    return found[1]


def from_environ(environ: Mapping[str, str]) -> ClusterEnv | None:
    """Read an srun task's position; None outside an srun step (see the module docstring).

    Raises:
        EnvError: a SLURM variable is missing, malformed, or contradicts another.

    Example:
        >>> env = from_environ({"SLURM_STEP_ID": "0", "SLURM_JOB_ID": "4242",
        ...     "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
        ...     "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NUM_NODES": "2",
        ...     "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_NODELIST": "gpu[07-08]"})
        >>> env.rank, env.local_world_size, env.master_addr, env.master_port
        (3, 2, 'gpu07', 23420)
    """
    step = step_id(environ)
    if step is None:
        return None
    needed = {
        "rank": ("SLURM_PROCID",),
        "world_size": _WORLD,
        "local_rank": ("SLURM_LOCALID",),
        "node_rank": ("SLURM_NODEID",),
        "num_nodes": _NODES,
    }
    found: dict[str, tuple[str, int]] = {}
    missing: list[str] = []
    for field, names in needed.items():
        minimum = 1 if field in ("world_size", "num_nodes") else 0
        number = read_int(environ, *names, minimum=minimum, fix=FIX)
        if number is None:
            missing.append(" or ".join(names))
        else:
            found[field] = number
    if missing:
        raise EnvError(
            f"inside SLURM step {step} but {', '.join(missing)} not set; expected srun to set "
            f"them for every task; {FIX}"
        )
    found["local_world_size"] = _local_world_size(environ, found)
    return build(
        "slurm",
        found,
        master_addr=_master_addr(environ),
        master_port=master_port(environ, _derived_port(environ, step), fix=FIX),
        fix=FIX,
    )


def tasks_per_node(text: str) -> list[int]:
    """Expand SLURM's compressed per-node counts: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``.

    Raises:
        EnvError: ``text`` is not in that format.

    Example:
        >>> tasks_per_node("2(x3),1")
        [2, 2, 2, 1]
    """
    counts: list[int] = []
    for item in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:\(x(\d+)\))?\s*", item)
        if match is None:
            raise EnvError(
                f"tasks-per-node list {text!r} has a malformed entry {item!r}; expected entries "
                f"like '2' or '2(x3)' separated by commas; {FIX}"
            )
        counts += [int(match[1])] * int(match[2] or 1)
    return counts


def expand_nodelist(text: str) -> list[str]:
    """Expand a SLURM host list into host names, in order, keeping zero padding.

    Handles ranges and lists in brackets, several bracket groups in one name and several names
    separated by commas: ``node[01-03,07]``, ``a[1-2],b3``, ``gpu-[001-002]-ib``,
    ``rack[1-2]-n[1-2]``.

    Raises:
        EnvError: unbalanced brackets, an empty name, or a range that is not ``lo-hi`` with
            lo <= hi.

    Example:
        >>> expand_nodelist("node[01-02,07],login")
        ['node01', 'node02', 'node07', 'login']
        >>> expand_nodelist("rack[1-2]-n[1-2]")
        ['rack1-n1', 'rack1-n2', 'rack2-n1', 'rack2-n2']
    """
    hosts: list[str] = []
    for name in _split_top_level(text):
        # "a[1-2]b[3,4]" -> ["a", "1-2", "b", "3,4", ""]: literals at even, groups at odd places.
        parts = re.split(r"\[([^\[\]]*)\]", name)
        if any("[" in p or "]" in p for p in parts[::2]):
            raise EnvError(f"host list {text!r} has unbalanced brackets in {name!r}; {FIX}")
        choices = [[p] if i % 2 == 0 else _expand_group(p, text) for i, p in enumerate(parts)]
        hosts += ["".join(combo) for combo in itertools.product(*choices)]
    return hosts


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are outside brackets."""
    names, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth < 0 or depth > 1:
            raise EnvError(f"host list {text!r} has unbalanced or nested brackets; {FIX}")
        if char == "," and depth == 0:
            names.append(text[start:i])
            start = i + 1
    names.append(text[start:])
    if depth != 0 or any(not n.strip() for n in names):
        raise EnvError(
            f"host list {text!r} is malformed (unclosed bracket or empty name); expected "
            f"names like 'node[01-04,07]' separated by commas; {FIX}"
        )
    return [n.strip() for n in names]


def _expand_group(group: str, text: str) -> list[str]:
    """``"01-03,07"`` -> ``["01", "02", "03", "07"]`` (width of the low end kept)."""
    out: list[str] = []
    for item in group.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", item)
        if match is None or (match[2] is not None and int(match[2]) < int(match[1])):
            raise EnvError(
                f"host list {text!r} has a bad range {item!r}; expected 'N' or 'LO-HI' with "
                f"LO <= HI inside brackets; {FIX}"
            )
        low, high = match[1], match[2] or match[1]
        out += [f"{n:0{len(low)}d}" for n in range(int(low), int(high) + 1)]
    return out


def _local_world_size(
    environ: Mapping[str, str], numbers: Mapping[str, tuple[str, int]]
) -> tuple[str, int]:
    """``(source name, tasks on this node)`` from the tasks-per-node list, or an even split;
    ``numbers`` are ``from_environ``'s (variable, value) by field."""
    world_name, world_size = numbers["world_size"]
    nodes_name, num_nodes = numbers["num_nodes"]
    node_rank = numbers["node_rank"][1]
    found = first(environ, *_TASKS_PER_NODE)
    if found is None:
        if world_size % num_nodes:
            raise EnvError(
                f"{world_name}={world_size} tasks do not split evenly over {nodes_name}="
                f"{num_nodes} nodes and SLURM_STEP_TASKS_PER_NODE is not set; expected srun to "
                f"set it; {FIX}"
            )
        return f"{world_name} / {nodes_name}", world_size // num_nodes
    name, text = found
    counts = tasks_per_node(text)
    if len(counts) != num_nodes or sum(counts) != world_size:
        raise EnvError(
            f"{name}={text!r} describes {len(counts)} nodes and {sum(counts)} tasks but "
            f"{nodes_name}={num_nodes} and {world_name}={world_size}; expected them to agree "
            f"(do not export SLURM_* variables by hand); {FIX}"
        )
    if node_rank >= num_nodes:
        raise EnvError(
            f"SLURM_NODEID={node_rank} but {nodes_name}={num_nodes}; expected a node index in "
            f"0..{num_nodes - 1}; {FIX}"
        )
    return f"{name}[SLURM_NODEID]", counts[node_rank]


def _master_addr(environ: Mapping[str, str]) -> str:
    given = value(environ, "MASTER_ADDR")
    if given is not None:
        return given
    found = first(environ, *_NODELIST)
    if found is None:
        raise EnvError(
            "inside a SLURM step but MASTER_ADDR, SLURM_STEP_NODELIST and SLURM_JOB_NODELIST are "
            "all unset; expected one of them to name rank 0's host; export MASTER_ADDR"
        )
    return expand_nodelist(found[1])[0]


def _derived_port(environ: Mapping[str, str], step: int) -> int:
    found = read_int(environ, *_JOB_ID, fix=FIX)
    if found is None:
        raise EnvError(
            "inside a SLURM step but SLURM_JOB_ID and MASTER_PORT are both unset; expected "
            "SLURM_JOB_ID to derive a port every task agrees on; export MASTER_PORT"
        )
    return PORT_BASE + (10 * found[1] + step) % PORT_SPAN

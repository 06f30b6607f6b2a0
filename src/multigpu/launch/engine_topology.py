"""What the engine that started ``multigpu run`` says of the job: torchrun's, SkyPilot's variables.

An engine that starts one launcher per node tells each one who it is through variables:

- **torchrun's** ``PET_<OPTION>``: torchrun's parser takes any of its options from
  ``PET_<DEST>`` when the command line does not give it (``PET_NNODES``, ``PET_NODE_RANK``,
  ``PET_MASTER_ADDR``, ``PET_RDZV_ENDPOINT``, ...). Kubeflow Trainer's torch runtime
  (``TrainJob``) and the Training Operator (``PyTorchJob``) set them in every pod, so plain
  ``torchrun script.py`` joins the pods into one job. ``multigpu run`` parses torchrun's options
  with the defaults removed (to tell an option typed from one defaulted), so it reads them here,
  the way torchrun does: option by option, the command line winning. ``PET_NPROC_PER_NODE`` is
  the one exception: it is read only when none of ``--cpu``, ``--gpus``, ``--nproc-per-node``
  is given, since ``--cpu N`` / ``--gpus`` are multigpu's spellings of the same thing.
- **SkyPilot's** ``SKYPILOT_NUM_NODES``, ``SKYPILOT_NODE_RANK`` and ``SKYPILOT_NODE_IPS`` (one
  address a line, node 0's first): the static rendezvous at node 0's address, on
  ``MASTER_PORT`` or 29500 (every node computes the same without talking). Read only when no
  ``PET_*`` variable and no command-line option names the topology.

Where they name one node (``PET_NNODES=1``), their rendezvous address and port are left out: one
node needs none, and ``multigpu run`` keeps its store on loopback (``--standalone``).

Where the variables name a job of several nodes but the command line asks for one node
(``--nnodes 1``, ``--standalone``), the launch is refused: a node that trains alone writes the
same checkpoints as every other node on a shared volume, while the others wait for it.

Environment variables read: torchrun's ``PET_*`` (one per option of ``torch.distributed.run``),
``SKYPILOT_NUM_NODES``, ``SKYPILOT_NODE_RANK``, ``SKYPILOT_NODE_IPS``, ``MASTER_PORT``.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from multigpu.errors import UsageError
from multigpu.launch.options import RDZV_DESTS, LaunchOptions, parse_nnodes

SKYPILOT_PORT = 29500
"""The rendezvous port under SkyPilot unless ``MASTER_PORT`` says otherwise (torchrun's)."""

_TOPOLOGY = ("nnodes", "node_rank", "master_addr", "master_port")


@dataclass(frozen=True, kw_only=True)
class EngineTopology:
    """The torchrun options an engine's variables give, and the line that says so."""

    options: LaunchOptions
    """The options with the variables' values added where the command line gave none."""
    used: tuple[str, ...]
    """The variables used, in the order read (empty: none applied)."""
    line: str
    """What was used, for one line on stderr (empty when nothing was used)."""


def _pet_actions() -> list[argparse.Action]:
    # torchrun's own parser says which options read PET_<DEST> (its `env` / `check_env`
    # actions), with their types: the same list torchrun uses, in every torch version.
    from torch.distributed.argparse_util import check_env, env
    from torch.distributed.run import get_args_parser

    return [a for a in get_args_parser()._actions if isinstance(a, (env, check_env))]


def pet_options(environ: Mapping[str, str]) -> dict[str, tuple[str, Any]]:
    """torchrun's options given by ``PET_*`` variables: dest → (variable, value as torchrun
    would parse it).

    Raises:
        UsageError: a value torchrun's parser would refuse (``PET_NODE_RANK=x``).

    Example:
        >>> pet_options({"PET_NNODES": "2", "PET_NODE_RANK": "1", "HOME": "/root"})
        {'nnodes': ('PET_NNODES', '2'), 'node_rank': ('PET_NODE_RANK', 1)}
    """
    from torch.distributed.argparse_util import check_env

    found: dict[str, tuple[str, Any]] = {}
    for action in _pet_actions():
        name = f"PET_{action.dest.upper()}"
        if name not in environ:
            continue
        text = environ[name]
        try:
            if isinstance(action, check_env):  # torchrun: bool(int(value)), "" counting as set
                value: Any = bool(int(text)) if text.strip() else True
            elif action.type is not None and callable(action.type):
                value = action.type(text)
            else:
                value = text
        except (TypeError, ValueError) as e:
            raise UsageError(
                f"{name}={text!r} from the environment is not a value of torchrun's "
                f"--{action.dest.replace('_', '-')}; expected what that option takes; fix or "
                f"unset {name}, or give --{action.dest.replace('_', '-')} on the command line"
            ) from e
        if isinstance(action, check_env) and not value:
            continue  # PET_STANDALONE=0: the flag is off, as if absent
        found[action.dest] = (name, value)
    return found


def skypilot_options(environ: Mapping[str, str]) -> dict[str, tuple[str, Any]] | None:
    """The static rendezvous of a SkyPilot task of several nodes; None outside one (or on one node).

    Raises:
        UsageError: the variables do not add up (a rank outside the nodes, too few addresses).

    Example:
        >>> got = skypilot_options({"SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_RANK": "1",
        ...     "SKYPILOT_NODE_IPS": "10.0.0.4\\n10.0.0.5"})
        >>> got["master_addr"], got["node_rank"]
        (('SKYPILOT_NODE_IPS', '10.0.0.4'), ('SKYPILOT_NODE_RANK', 1))
    """
    if "SKYPILOT_NUM_NODES" not in environ:
        return None
    given = {k: environ.get(k, "") for k in ("SKYPILOT_NUM_NODES", "SKYPILOT_NODE_RANK")}
    try:
        nodes, rank = int(given["SKYPILOT_NUM_NODES"]), int(given["SKYPILOT_NODE_RANK"])
        port = int(environ.get("MASTER_PORT", SKYPILOT_PORT))
    except ValueError as e:
        raise UsageError(
            f"SkyPilot's variables SKYPILOT_NUM_NODES={given['SKYPILOT_NUM_NODES']!r} "
            f"SKYPILOT_NODE_RANK={given['SKYPILOT_NODE_RANK']!r} MASTER_PORT="
            f"{environ.get('MASTER_PORT', '')!r}; expected whole numbers; run multigpu inside a "
            "SkyPilot task as it sets them, or unset them"
        ) from e
    if nodes < 2:
        return None
    ips = environ.get("SKYPILOT_NODE_IPS", "").split()
    if not 0 <= rank < nodes or len(ips) < nodes:
        raise UsageError(
            f"SkyPilot's variables do not add up: SKYPILOT_NUM_NODES={nodes}, "
            f"SKYPILOT_NODE_RANK={rank}, {len(ips)} address(es) in SKYPILOT_NODE_IPS; expected "
            "a rank below the number of nodes and an address per node; run multigpu inside a "
            "SkyPilot task as it sets them, or give --nnodes, --node-rank and --master-addr"
        )
    return {
        "nnodes": ("SKYPILOT_NUM_NODES", str(nodes)),
        "node_rank": ("SKYPILOT_NODE_RANK", rank),
        "master_addr": ("SKYPILOT_NODE_IPS", ips[0]),
        "master_port": ("MASTER_PORT", port),
    }


SKYPILOT_VARIABLES = ("SKYPILOT_NUM_NODES", "SKYPILOT_NODE_RANK", "SKYPILOT_NODE_IPS")


def one_machine_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the variables that make ``multigpu run`` join a job of several
    nodes: for the runs of ``multigpu verify`` and ``bench``, which compare process counts on
    this machine alone, also inside a pod or a SkyPilot task.

    Example:
        >>> one_machine_env({"PET_NNODES": "2", "SKYPILOT_NODE_RANK": "1", "HOME": "/root"})
        {'HOME': '/root'}
    """
    return {
        k: v for k, v in environ.items() if not k.startswith("PET_") and k not in SKYPILOT_VARIABLES
    }


def engine_nodes(environ: Mapping[str, str]) -> str | None:
    """``NAME=VALUE`` of the variable by which an engine names a job of several nodes, else None.

    Example:
        >>> engine_nodes({"PET_NNODES": "1:4"}), engine_nodes({"SKYPILOT_NUM_NODES": "1"})
        ('PET_NNODES=1:4', None)
    """
    text = environ.get("PET_NNODES")
    if text is not None:
        try:
            many = parse_nnodes(text)[1] > 1
        except UsageError:
            many = False  # said by with_engine_topology, in its own words
        if many:
            return f"PET_NNODES={text}"
    named = _skypilot_nodes(environ)
    return f"{named[0]}={named[1]}" if named else None


def _skypilot_nodes(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(variable, value) when SkyPilot's variables name more than one node."""
    text = environ.get("SKYPILOT_NUM_NODES", "")
    return ("SKYPILOT_NUM_NODES", text) if text.strip().isdigit() and int(text) > 1 else None


def _multi_node(values: Mapping[str, tuple[str, Any]]) -> tuple[str, str] | None:
    """(variable, value) when the variables name more than one node."""
    if "nnodes" not in values:
        return None
    name, text = values["nnodes"]
    try:
        high = parse_nnodes(str(text))[1]
    except UsageError as e:
        raise UsageError(f"{name}={text!r} from the environment: {e}") from e
    return (name, str(text)) if high > 1 else None


def with_engine_topology(options: LaunchOptions, environ: Mapping[str, str]) -> EngineTopology:
    """``options`` with the torchrun options the engine's variables give, where not typed.

    Raises:
        UsageError: the variables name several nodes but the command line one node, or a
            variable holds a value torchrun would refuse.

    Example:
        >>> from multigpu.launch.options import LaunchOptions
        >>> env = {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "job-node-0-0.job",
        ...        "PET_MASTER_PORT": "29500"}
        >>> t = with_engine_topology(LaunchOptions(script="train.py"), env)
        >>> dict(t.options.torchrun)["node_rank"], t.used[0]
        (1, 'PET_NNODES')
    """
    found = pet_options(environ)
    device_given = options.cpu is not None or options.gpus is not None
    if device_given or options.given("nproc_per_node"):
        found.pop("nproc_per_node", None)  # --cpu / --gpus / --nproc-per-node say it already
    typed_topology = any(options.given(d) for d in (*_TOPOLOGY, *RDZV_DESTS))
    if not any(d in found for d in (*_TOPOLOGY, *RDZV_DESTS)) and not typed_topology:
        found.update(skypilot_options(environ) or {})
        sky_named = None
    else:
        sky_named = _skypilot_nodes(environ)  # not used, but a multi-node task all the same
    named = _multi_node(found) or sky_named
    if "nnodes" in found and named is None and not options.given("nnodes"):
        # One node (a TrainJob of numNodes 1): its store stays on loopback on a free port
        # (--standalone) rather than on the pod's address at the operator's fixed port.
        found = {d: v for d, v in found.items() if d not in (*_TOPOLOGY, *RDZV_DESTS)}
    applied = {d: v for d, v in found.items() if not options.given(d)}
    merged = {**options.torchrun, **{d: value for d, (_, value) in applied.items()}}
    result = dataclasses.replace(options, torchrun=MappingProxyType(merged))
    if named is not None and (result.max_nodes == 1 or merged.get("standalone")):
        typed = f"--nnodes {options.get('nnodes')}" if options.given("nnodes") else "--standalone"
        raise UsageError(
            f"the environment names a job of several nodes ({named[0]}={named[1]}) but the "
            f"command line asks for one node ({typed}): this node would train alone; expected "
            f"the engine's topology; drop {typed}, or unset {named[0]} to train on this node only"
        )
    if not applied:
        return EngineTopology(options=result, used=(), line="")
    used = tuple(name for name, _ in applied.values())
    return EngineTopology(options=result, used=used, line=_line(result, applied))


def _line(options: LaunchOptions, applied: Mapping[str, tuple[str, Any]]) -> str:
    values = ", ".join(f"{name}={value}" for name, value in applied.values())
    if not any(d in applied for d in (*_TOPOLOGY, *RDZV_DESTS)):
        return f"from the environment: {values}; options typed win"
    nnodes = str(options.get("nnodes", "1"))
    if options.get("rdzv_backend", "static") != "static":
        where = f"{options.get('rdzv_backend')} rendezvous at {options.get('rdzv_endpoint', '')}"
        who = f"a node of {nnodes}"
    else:
        where = (
            f"rendezvous at {options.get('master_addr', '127.0.0.1')}:"
            f"{options.get('master_port', 29500)}"
        )
        who = f"node {options.get('node_rank', 0)} of {nnodes}"
    return f"{who} from the environment ({values}), {where}; options typed win"

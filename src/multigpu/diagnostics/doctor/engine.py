"""The doctor's rows for an engine's variables: a Kubernetes pod of a Kubeflow ``TrainJob`` or
``PyTorchJob`` (torchrun's ``PET_*`` variables, which the operator sets in each pod) or a SkyPilot
node (``SKYPILOT_*``).

``multigpu run`` takes its nodes, node rank and rendezvous from them
(``multigpu.launch.engine_topology``); these rows say which engine was found and what the run
will take, and check what it needs first: that the values are ones torchrun takes and that the
rendezvous host resolves (in a pod: the job's headless service names each pod once it runs).

Environment variables read: torchrun's ``PET_*``, ``SKYPILOT_NUM_NODES``, ``SKYPILOT_NODE_RANK``,
``SKYPILOT_NODE_IPS``, ``MASTER_PORT``, ``KUBERNETES_SERVICE_HOST`` (set in every pod).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from multigpu.common.host import Interface
from multigpu.diagnostics.doctor.checks import Check, fail, ok
from multigpu.diagnostics.doctor.network import is_local, resolve
from multigpu.errors import UsageError
from multigpu.launch.engine_topology import pet_options, skypilot_options

TOPOLOGY = ("nnodes", "node_rank", "master_addr", "master_port", "rdzv_endpoint")


def engine_rows(environ: Mapping[str, str], interfaces: Sequence[Interface]) -> list[Check]:
    """The engine rows: none where no engine's variables name a topology.

    Example:
        >>> engine_rows({"HOME": "/root"}, [])
        []
        >>> pod = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "PET_NNODES": "2", "PET_NODE_RANK": "1",
        ...        "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": "29500"}
        >>> rows = engine_rows(pod, [])
        >>> rows[0].value.split(";")[0]
        'a Kubernetes pod (torchrun PET_* variables): node 1 of 2, rendezvous 127.0.0.1:29500'
    """
    try:
        values: Mapping[str, tuple[str, Any]] = pet_options(environ)
        kind = "torchrun PET_* variables"
        if not any(k in values for k in TOPOLOGY):
            values, kind = skypilot_options(environ) or {}, "SkyPilot's SKYPILOT_* variables"
    except UsageError as e:
        return [
            fail(
                "launch",
                "engine",
                str(e),
                "fix the variable it names (the engine's manifest or task sets it), or unset it",
            )
        ]
    if not any(k in values for k in TOPOLOGY):
        return []
    where = "a Kubernetes pod" if environ.get("KUBERNETES_SERVICE_HOST") else (
        "a SkyPilot node" if kind.startswith("SkyPilot") else "a node"
    )  # fmt: skip
    host, port = _rendezvous(values)
    nodes = values.get("nnodes", ("", "1"))[1]
    rank = values.get("node_rank", ("", 0))[1]
    names = ", ".join(sorted({name for name, _ in values.values()}))
    rows = [
        ok(
            "launch",
            "engine",
            f"{where} ({kind}): node {rank} of {nodes}, rendezvous {host or '?'}:{port or '?'}; "
            f"`multigpu run` takes them ({names}), options typed win",
        )
    ]
    if host:
        addresses = resolve(host)
        if not addresses:
            rows.append(
                fail(
                    "launch",
                    "engine rendezvous",
                    f"{host} (the rendezvous host the engine names) does not resolve",
                    "in a pod: the job's headless service names each pod once it runs; run the "
                    "doctor when every pod of the job is up, or check the job's Service and "
                    "NetworkPolicy",
                )
            )
        else:
            mine = "this machine" if is_local(addresses, interfaces) else "another machine"
            rows.append(
                ok("launch", "engine rendezvous", f"{host} -> {', '.join(addresses)} ({mine})")
            )
    return rows


def _rendezvous(values: Mapping[str, tuple[str, Any]]) -> tuple[str, str]:
    """(host, port) the variables name: ``rdzv_endpoint``, else ``master_addr``/``master_port``."""
    endpoint = str(values.get("rdzv_endpoint", ("", ""))[1])
    if endpoint:
        host, _, port = endpoint.rpartition(":") if ":" in endpoint else (endpoint, "", "")
        return host.strip("[]"), port
    host = str(values.get("master_addr", ("", ""))[1])
    port = str(values.get("master_port", ("", ""))[1])
    return host, port

"""Network checks: interfaces (state, MTU, IPv4), MTU agreement, and the interfaces that gloo
and NCCL are told to use (``GLOO_SOCKET_IFNAME``, ``NCCL_SOCKET_IFNAME``).

The interfaces themselves are read by ``multigpu.host`` (the launcher's ``--iface`` reads them
the same way).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence

from multigpu.diagnostics.doctor.checks import Check, fail, ok, skip, warn
from multigpu.host import Interface

VIRTUAL_PREFIXES = ("veth", "docker", "br-", "virbr", "cni", "flannel", "cali", "vxlan", "kube")
"""Interfaces of container and VM plumbing: their MTU is not the nodes' network's."""


def interface_rows(interfaces: Sequence[Interface]) -> list[Check]:
    """One row per interface: OK when it can carry traffic, SKIP (with its state) otherwise."""
    return [
        ok("network", i.name, i.describe())
        if i.usable
        else skip("network", i.name, f"{i.describe()}: cannot carry traffic")
        for i in interfaces
    ]


def mtu_check(interfaces: Sequence[Interface]) -> Check:
    """WARN when the usable, non-loopback, non-virtual interfaces have different MTUs."""
    real = [
        i
        for i in interfaces
        if i.usable and not i.loopback and not i.name.startswith(VIRTUAL_PREFIXES)
    ]
    mtus = {i.mtu for i in real}
    shown = ", ".join(f"{i.name} {i.mtu}" for i in real)
    if not real:
        return skip("network", "MTU", "no usable interface besides loopback and virtual ones")
    if len(mtus) == 1:
        return ok("network", "MTU", shown)
    return warn(
        "network",
        "MTU",
        f"{shown}: differ; a path with a smaller MTU fragments or drops large packets",
        "pin the interface that connects the nodes with `multigpu run --iface NAME` and give it "
        "the same MTU on every node (ip link set dev NAME mtu N)",
    )


def _matches(
    spec: str, interfaces: Sequence[Interface], *, nccl: bool
) -> tuple[list[str], list[str]]:
    """(interfaces ``spec`` selects, names it gives that select nothing)."""
    if nccl and spec.startswith("^"):  # NCCL: "^docker,lo" excludes those prefixes
        excluded = tuple(p for p in spec[1:].split(",") if p)
        return [i.name for i in interfaces if not i.name.startswith(excluded)], []
    exact = not nccl or spec.startswith("=")  # gloo: exact names; NCCL: prefixes unless "="
    chosen: list[str] = []
    missing: list[str] = []
    for part in filter(None, spec.lstrip("=").split(",")):
        hits = [
            i.name for i in interfaces if (i.name == part if exact else i.name.startswith(part))
        ]
        chosen += hits
        if not hits:
            missing.append(part)
    return chosen, missing


def ifname_check(
    variable: str, environ: Mapping[str, str], interfaces: Sequence[Interface]
) -> Check:
    """``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME``: FAIL when it names an interface that does
    not exist here or cannot carry traffic; SKIP when unset.
    """
    spec = environ.get(variable, "").strip()
    library = "NCCL" if variable.startswith("NCCL") else "gloo"
    if not spec:
        default = (
            "NCCL picks an ib* interface, else the first that is not lo or docker*"
            if library == "NCCL"
            else "gloo binds to the address the hostname resolves to"
        )
        return skip("network", variable, f"unset: {default}")
    by_name = {i.name: i for i in interfaces}
    chosen, missing = _matches(spec, interfaces, nccl=library == "NCCL")
    unusable = [name for name in chosen if not by_name[name].usable]
    have = ", ".join(i.name for i in interfaces if i.usable) or "none"
    fix = (
        f"set {variable} to an interface that is up on the network connecting the nodes "
        f"(here: {have}), or unset it; `multigpu run --iface NAME` sets it for you"
    )
    if missing:
        return fail(
            "network",
            variable,
            f"{variable}={spec}: no interface {', '.join(missing)} on {socket.gethostname()}",
            fix,
        )
    if unusable or not chosen:
        down = ", ".join(f"{n} ({by_name[n].describe()})" for n in unusable) or "nothing"
        return fail("network", variable, f"{variable}={spec} selects {down}", fix)
    return ok(
        "network", variable, f"{spec}: " + "; ".join(f"{n} {by_name[n].describe()}" for n in chosen)
    )


def used_interface(environ: Mapping[str, str], interfaces: Sequence[Interface]) -> Interface | None:
    """The interface this rank talks to the others over: the one ``GLOO_SOCKET_IFNAME`` /
    ``NCCL_SOCKET_IFNAME`` name, else the one whose address routes to ``MASTER_ADDR``.
    """
    by_name = {i.name: i for i in interfaces}
    for variable in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        first = environ.get(variable, "").lstrip("=").split(",")[0]
        if first in by_name:
            return by_name[first]
    host = environ.get("MASTER_ADDR")
    if not host:
        return None
    try:  # connecting a UDP socket sends nothing: the kernel only picks the route and source
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((host, int(environ.get("MASTER_PORT") or 29500)))
            source = sock.getsockname()[0]
    except (OSError, ValueError):
        return None
    same = [i for i in interfaces if i.ipv4 == source]
    if not same and source.startswith("127."):
        same = [i for i in interfaces if i.loopback]
    return same[0] if same else None

"""Network and launch checks: interfaces (state, MTU, IPv4), MTU agreement, the interfaces that
gloo and NCCL are told to use (``GLOO_SOCKET_IFNAME``, ``NCCL_SOCKET_IFNAME``); what launcher
this process detects, the hostname, ``MASTER_ADDR`` and the rendezvous port.

The interfaces themselves are read by ``multigpu.common.host`` (the launcher's ``--iface`` reads
them the same way).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping, Sequence

from multigpu.common.host import Interface
from multigpu.diagnostics.doctor.checks import Check, fail, ok, skip, warn
from multigpu.env import ClusterEnv, detect
from multigpu.errors import EnvError

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


DEFAULT_PORT = 29500
"""torch's default ``MASTER_PORT`` (``--master-port``)."""


def env_check(environ: Mapping[str, str]) -> tuple[Check, ClusterEnv | None]:
    """The launch environment ``multigpu.init`` would detect; FAIL with the reason if invalid.

    Example:
        >>> env_check({})[0].value
        'single process (no launcher detected)'
    """
    try:
        env = detect(environ)
    except EnvError as e:
        return (
            fail(
                "launch",
                "environment",
                str(e),
                "make the launcher's variables agree (the message names them) or start the job "
                "with `multigpu run`",
            ),
            None,
        )
    if env.source == "single":
        return ok("launch", "environment", "single process (no launcher detected)"), env
    where = (
        f"{env.source}: rank {env.rank} of {env.world_size}, local rank {env.local_rank} of "
        f"{env.local_world_size}, node {env.node_rank} of {env.num_nodes}, master "
        f"{env.master_addr}:{env.master_port}"
    )
    return ok("launch", "environment", where), env


def resolve(host: str) -> list[str]:
    """The IPv4 addresses ``host`` resolves to ([] when it does not)."""
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return sorted({str(info[4][0]) for info in infos})


def is_local(addresses: Sequence[str], interfaces: Sequence[Interface]) -> bool:
    """Whether one of ``addresses`` is this machine's (a loopback or an interface's address)."""
    mine = {i.ipv4 for i in interfaces if i.ipv4}
    return any(ipaddress.ip_address(a).is_loopback or a in mine for a in addresses)


def hostname_check(hostname: str, addresses: Sequence[str], *, several_nodes: bool) -> Check:
    """The hostname and what it resolves to: gloo and torchrun's agent publish that address.

    WARN when it does not resolve, or resolves to loopback only in a job of several nodes
    (the others would be told to connect to 127.0.x.x).
    """
    fix = (
        "pass `--iface NAME` to `multigpu run` on every node (its address is then used), or map "
        "the hostname to the node's network address in /etc/hosts"
    )
    if not addresses:
        return warn("launch", "hostname", f"{hostname} does not resolve to an IPv4 address", fix)
    value = f"{hostname} -> {', '.join(addresses)}"
    loopback = all(ipaddress.ip_address(a).is_loopback for a in addresses)
    if loopback and several_nodes:
        return warn(
            "launch", "hostname", f"{value}: loopback, unreachable from the other nodes", fix
        )
    if loopback:
        value += " (loopback: fine on one machine; several nodes need --iface)"
    return ok("launch", "hostname", value)


def master_addr_check(
    environ: Mapping[str, str], interfaces: Sequence[Interface]
) -> tuple[Check, bool]:
    """``MASTER_ADDR``: this machine, or a host that resolves. Returns (row, is it local)."""
    host = environ.get("MASTER_ADDR", "").strip()
    if not host:
        return skip("launch", "MASTER_ADDR", "unset: on one node the launcher picks it"), True
    addresses = resolve(host)
    if not addresses:
        return (
            fail(
                "launch",
                "MASTER_ADDR",
                f"{host} does not resolve to an IPv4 address",
                "set MASTER_ADDR (or --rdzv-endpoint / --master-addr) to the store node's IP "
                "address, or add its name to /etc/hosts or DNS",
            ),
            False,
        )
    local = is_local(addresses, interfaces)
    where = "this machine" if local else "another machine"
    return ok("launch", "MASTER_ADDR", f"{host} -> {', '.join(addresses)} ({where})"), local


def port_check(environ: Mapping[str, str], *, local: bool) -> Check:
    """The rendezvous port (``MASTER_PORT``, default 29500): WARN naming it when it is taken.

    Only outside a launched job: inside one, the port belongs to the job's store (rank 0 binds
    it when the group starts), and the process-group rows report whether the ranks met there.
    """
    raw = environ.get("MASTER_PORT", "").strip() or str(DEFAULT_PORT)
    if not raw.isdigit() or not 0 <= int(raw) <= 65535:
        return fail(
            "launch",
            "rendezvous port",
            f"MASTER_PORT={raw!r} is not a port number",
            "set MASTER_PORT to a free port in 1-65535, or unset it",
        )
    port = int(raw)
    if not local:
        host = environ.get("MASTER_ADDR", "")
        return skip(
            "launch", "rendezvous port", f"{port} is on {host}, not here: run the doctor there"
        )
    try:
        socket.create_server(("", port)).close()  # SO_REUSEADDR: TIME_WAIT does not count
    except OSError as e:
        return warn(
            "launch",
            "rendezvous port",
            f"{port} is in use on this machine ({e.strerror})",
            f"pick another port: `multigpu run --master-port P` on one node, `--rdzv-endpoint "
            f"HOST:P` on several; `ss -ltnp 'sport = :{port}'` shows who holds {port}",
        )
    return ok("launch", "rendezvous port", f"{port} is free on this machine")


def launch_checks(
    environ: Mapping[str, str], interfaces: Sequence[Interface]
) -> tuple[list[Check], ClusterEnv | None]:
    """Every launch row, and the environment detected (None when it is invalid).

    Example:
        >>> [c.name for c in launch_checks({}, [])[0]]
        ['environment', 'hostname', 'MASTER_ADDR', 'rendezvous port']
    """
    env_row, env = env_check(environ)
    several = env is not None and env.world_size > env.local_world_size
    name = socket.gethostname()
    addr_row, local = master_addr_check(environ, interfaces)
    rows = [env_row, hostname_check(name, resolve(name), several_nodes=several), addr_row]
    if env is None or env.source not in ("torchrun", "ray"):  # their store owns MASTER_PORT
        rows.append(port_check(environ, local=local))
    return rows, env

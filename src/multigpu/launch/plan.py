"""The launch plan: devices, processes, threads, torchrun arguments and the workers' environment.

Everything here is a pure function of the options, the environment and the machine's facts
(GPUs, cores), so ``--dry-run`` and the tests see exactly what a real launch would do.

Environment variables read (from the ``environ`` passed in): ``OMP_NUM_THREADS``,
``MKL_NUM_THREADS``, ``MULTIGPU_CPU_ALLOCATOR`` and ``LD_PRELOAD`` (``launch.cpu_allocator``),
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE`` (left as the user set them; else
set to 1 where workers may restart), ``MULTIGPU_TIMEOUT`` (the default of ``--timeout``); for
``--cpu auto``, the split saved by ``multigpu bench scaling`` (see ``launch.cpu_split``).
"""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

from multigpu.common.host import loopback_interface
from multigpu.errors import UsageError
from multigpu.launch.cpu_allocator import choose_allocator
from multigpu.launch.options import RDZV_DESTS, LaunchOptions, torchrun_argv
from multigpu.launch.ports import store_port
from multigpu.launch.timeouts import DEFAULT_TIMEOUT_S, job_timeout_s, rendezvous_conf

if TYPE_CHECKING:
    from multigpu.gpus import GPUInfo

logger = logging.getLogger(__name__)

DeviceKind = Literal["cuda", "cpu"]

CPU_DEFAULT_WHY = (
    "measured on 2 cores with gloo, 2 processes x 1 thread ran a 3.2M-parameter MLP at 0.55x "
    "the speed of 1 process x 2 threads (a 78k CNN 1.05x), so splitting cores only pays for "
    "tiny models"
)


@dataclass(frozen=True, kw_only=True)
class DeviceRequest:
    """Which kind of device to use and how much of it, before any GPU is claimed."""

    kind: DeviceKind
    """``cuda`` (claim GPUs) or ``cpu`` (processes on gloo)."""
    processes: int
    """Processes per node for ``cpu``; 0 for ``cuda`` (one per GPU, known after the claim)."""
    gpus: str = ""
    """The GPU request text for ``claim_gpus`` (``auto``, ``N`` or ``i,j``); empty for ``cpu``."""
    note: str = ""
    """Why this was chosen, when the user did not say (logged as one info line)."""


@dataclass(frozen=True, kw_only=True)
class LaunchPlan:
    """What ``multigpu run`` will start. Made by ``build_plan``; printed by ``--dry-run``."""

    device: DeviceKind
    """``cuda`` or ``cpu``."""
    gpus: tuple[GPUInfo, ...] = ()
    """The GPUs chosen (and locked) for this run; empty on CPU."""
    nproc_per_node: int
    """Worker processes on this node."""
    threads_per_process: int | None
    """OMP/MKL threads per worker that multigpu sets; None when the user set OMP_NUM_THREADS."""
    torchrun_args: tuple[str, ...]
    """The argument list given to ``torch.distributed.run`` (script and its arguments last)."""
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Variables set for the workers on top of the user's environment."""
    store_port: tuple[str, int] | None = None
    """(how it was chosen, port) when this node hosts the rendezvous store on a fixed port."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    """The bound on every wait: collectives, rendezvous, store calls, exit barrier."""
    notes: tuple[str, ...] = ()
    """One-line explanations of defaults that were applied."""

    def describe(self) -> str:
        """The plan as a few human-readable lines (what ``--dry-run`` prints)."""
        if self.device == "cuda":
            names = ", ".join(f"{g.index}: {g.name}" for g in self.gpus) or "none"
            devices = f"cuda GPUs [{names}]"
        else:
            devices = "cpu"
        threads = (
            "as set by OMP_NUM_THREADS"
            if self.threads_per_process is None
            else f"{self.threads_per_process} thread(s) each"
        )
        lines = [
            f"devices:   {devices}",
            f"processes: {self.nproc_per_node} per node, {threads}",
            "torchrun:  " + shlex.join(["torchrun", *self.torchrun_args]),
            "env:       " + (" ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items()) or "-"),
            f"timeout:   {self.timeout_s:g} s for any collective, rendezvous, store call or exit "
            "barrier (--timeout)",
        ]
        lines += [f"note:      {n}" for n in self.notes]
        return "\n".join(lines)


def _nproc_given(options: LaunchOptions) -> str | None:
    value = options.get("nproc_per_node")
    return None if value is None else str(value).strip()


def _workers_may_restart(options: LaunchOptions) -> bool:
    """True when the agent may start workers again: ``--max-restarts`` > 0, or several nodes
    (a node joining or leaving an elastic job restarts every worker)."""
    return int(options.get("max_restarts", 0) or 0) > 0 or options.max_nodes > 1


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def request_devices(options: LaunchOptions, *, gpu_count: int, cores: int) -> DeviceRequest:
    """Decide CPU or GPUs and how many, from the options and what the machine has.

    Default: every free GPU when there are GPUs; on a CPU-only machine ONE process using all
    cores (see ``CPU_DEFAULT_WHY``). ``--nproc-per-node`` keeps torchrun's meaning (N workers,
    or ``cpu``/``gpu``/``auto``) and must agree with ``--cpu``/``--gpus`` when given with them.
    ``gpu_count`` is ``len(list_gpus())`` (no CUDA touched); ``cores``, those this process may use.

    Raises:
        UsageError: contradicting options, GPUs or nccl asked for on a machine without GPUs.
    """
    nproc_text = _nproc_given(options)
    nproc = _int_or_none(nproc_text)
    if nproc_text is not None and nproc is None and nproc_text not in ("cpu", "gpu", "auto"):
        raise UsageError(
            f"--nproc-per-node {nproc_text} is not understood; expected a number, cpu, gpu or "
            "auto; e.g. --nproc-per-node 2"
        )
    if nproc is not None and nproc < 1:
        raise UsageError(
            f"--nproc-per-node {nproc} is not a number of processes; expected >= 1; "
            "e.g. --nproc-per-node 2"
        )
    node_rank = int(options.get("node_rank", 0))  # torchrun's parser made it an int
    static = options.get("rdzv_backend", "static") == "static"  # c10d ranks nodes itself
    if static and not 0 <= node_rank < options.max_nodes:
        # Otherwise the node waits out the rendezvous timeout for a place that cannot exist.
        raise UsageError(
            f"--node-rank {node_rank} is not a node of --nnodes {options.get('nnodes', 1)}; "
            f"expected 0 to {options.max_nodes - 1}; give each node its own rank below --nnodes"
        )
    if options.cpu is not None and options.gpus is not None:
        raise UsageError(
            f"--cpu {options.cpu} and --gpus {options.gpus} were given together; expected one "
            "device option; use --cpu N for CPU processes or --gpus for GPUs"
        )
    if options.backend == "nccl" and (options.cpu is not None or gpu_count == 0):
        where = f"--cpu {options.cpu}" if options.cpu is not None else "this machine (no GPU)"
        raise UsageError(
            f"--backend nccl was asked for on {where}; nccl needs CUDA GPUs; use --backend gloo "
            "or leave --backend auto"
        )

    if options.cpu is not None:
        if nproc_text is not None and nproc != options.cpu:
            raise UsageError(
                f"--nproc-per-node {nproc_text} contradicts --cpu {options.cpu}; expected the "
                "same number of processes; drop --nproc-per-node (--cpu N sets it)"
            )
        if isinstance(options.cpu, str):  # --cpu auto: the split `bench scaling` measured here
            from multigpu.launch.cpu_split import cpu_auto_split

            n, why = cpu_auto_split(options.script, is_module=options.is_module, cores=cores)
            return DeviceRequest(kind="cpu", processes=_cpu(options, n).processes, note=why)
        return _cpu(options, options.cpu)
    if options.gpus is not None:
        return DeviceRequest(kind="cuda", processes=0, gpus=options.gpus)
    if nproc_text == "cpu":
        return _cpu(options, cores)
    if nproc_text == "gpu" and gpu_count == 0:
        raise UsageError(
            "--nproc-per-node gpu asks for one process per GPU but this machine has none; "
            "use --cpu N for N CPU processes"
        )
    if nproc_text == "gpu" or (gpu_count > 0 and nproc_text in (None, "auto")):
        return DeviceRequest(kind="cuda", processes=0, gpus="auto")
    if gpu_count > 0 and nproc is not None:
        return DeviceRequest(kind="cuda", processes=0, gpus=str(nproc))
    if nproc_text == "auto":
        return _cpu(options, cores)  # torchrun's meaning on a machine without GPUs: one per core
    if nproc is not None:
        return _cpu(options, nproc)
    return DeviceRequest(
        kind="cpu",
        processes=1,
        note=(
            # One short line: the measurement behind the default is in `multigpu run --help`.
            f"no GPU found: 1 process on {cores} core(s), usually faster than splitting them "
            "(see --help); --cpu N for N"
        ),
    )


def _cpu(options: LaunchOptions, processes: int) -> DeviceRequest:
    if options.one_process and processes > 1:
        raise UsageError(
            f"--strategy dp with {processes} CPU processes; dp runs ONE process; "
            "drop --cpu or use --strategy ddp"
        )
    return DeviceRequest(kind="cpu", processes=processes)


WORKER_SITE = str(Path(__file__).resolve().parent / "worker_site")
"""First on the CPU workers' ``PYTHONPATH``: its ``sitecustomize`` explains a script's request
for CUDA or NCCL."""


def build_plan(
    options: LaunchOptions,
    request: DeviceRequest,
    *,
    environ: Mapping[str, str],
    cores: int,
    gpus: Sequence[GPUInfo] = (),
    cuda_visible_devices: str | None = None,
    iface_address: str | None = None,
    tbb_libraries: tuple[str, ...] | None = None,
) -> LaunchPlan:
    """Build the launch plan from the options and the devices chosen.

    ``gpus`` and ``cuda_visible_devices`` are the ``GPUClaim``'s, for ``cuda``;
    ``iface_address``, the address of ``--iface``, is advertised by the agent as
    ``--local-addr`` unless the user gave one; ``tbb_libraries``, where oneTBB's allocator is
    installed (``cpu_allocator.tbb_libraries()``), is preloaded into CPU workers.

    Raises:
        UsageError: ``--nproc-per-node`` contradicts the number of GPUs chosen; a bad
            ``MULTIGPU_TIMEOUT`` or ``MULTIGPU_CPU_ALLOCATOR``.
    """
    env: dict[str, str] = {}
    notes = [request.note] if request.note else []
    if request.kind == "cuda":
        nproc = 1 if options.one_process else len(gpus)
        given = _int_or_none(_nproc_given(options))
        if given is not None and given != nproc:
            raise UsageError(
                f"--nproc-per-node {given} contradicts the {len(gpus)} GPU(s) chosen by --gpus "
                f"{request.gpus}; expected {nproc}; drop --nproc-per-node (--gpus sets it)"
            )
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices or ",".join(str(g.index) for g in gpus)
        # Indices in CUDA_VISIBLE_DEVICES are nvidia-smi's (PCI order); make CUDA agree.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    else:
        nproc = request.processes
        env["MULTIGPU_DEVICE"] = "cpu"
        env["CUDA_VISIBLE_DEVICES"] = ""  # CPU workers must never create a CUDA context
        # A script written for GPUs (init_process_group("nccl"), .cuda()) then says so in one
        # line (worker_site/sitecustomize.py).
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [WORKER_SITE, environ.get("PYTHONPATH")]))
    threads: int | None = None
    if "OMP_NUM_THREADS" not in environ:
        # torchrun would force 1 thread per worker; share the cores instead.
        threads = max(1, cores // nproc)
        env["OMP_NUM_THREADS"] = str(threads)
        if "MKL_NUM_THREADS" not in environ:
            env["MKL_NUM_THREADS"] = str(threads)
    if options.backend != "auto":
        env["MULTIGPU_BACKEND"] = options.backend
    if "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in environ and _workers_may_restart(options):
        # torch 2.13: restarted workers may read the dead attempt's gloo address from the
        # agent's shared store and fail to connect; a store per attempt avoids it. Only where
        # workers can restart: a store per attempt is hosted by rank 0's worker, and a rank
        # that connects before it listens is refused and retries ~0.5 s later (one launch in
        # three or four; benchmarks/RESULTS.md).
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    if options.iface:
        # gloo and NCCL otherwise pick the interface the hostname resolves to (127.0.1.1 on
        # many Linux installations, or the wrong network on machines with several).
        env["GLOO_SOCKET_IFNAME"] = env["NCCL_SOCKET_IFNAME"] = options.iface
    elif options.max_nodes == 1 and "GLOO_SOCKET_IFNAME" not in environ:
        # One node: gloo's sockets on loopback, not on the address the hostname resolves to
        # (often the machine's public one): nothing of the job listens beyond this machine.
        loopback = loopback_interface()
        if loopback is not None:
            env["GLOO_SOCKET_IFNAME"] = loopback
    allocator = choose_allocator(environ, device=request.kind, libraries=tbb_libraries)
    env.update(allocator.env)
    if allocator.note:
        notes.append(allocator.note)
    timeout_s = job_timeout_s(options.timeout, environ)
    if options.timeout is not None:
        env["MULTIGPU_TIMEOUT"] = f"{options.timeout:g}"

    return LaunchPlan(
        device=request.kind,
        gpus=tuple(gpus) if request.kind == "cuda" else (),
        nproc_per_node=nproc,
        threads_per_process=threads,
        torchrun_args=tuple(_torchrun_args(options, nproc, timeout_s, iface_address)),
        env=MappingProxyType(env),
        store_port=store_port(options),
        timeout_s=timeout_s,
        notes=tuple(notes),
    )


def _torchrun_args(
    options: LaunchOptions, nproc: int, timeout_s: float, iface_address: str | None
) -> list[str]:
    # torchrun's parser is the reference for its option spellings; imported late because it
    # imports torch, which the pure planning functions above do not need.
    from torch.distributed.run import get_args_parser

    # A store on a free port: two single-node jobs never fight over torchrun's 29500.
    standalone = options.max_nodes == 1 and not any(options.given(d) for d in RDZV_DESTS)
    given = {k: v for k, v in options.torchrun.items() if k != "nproc_per_node"}  # set below
    if iface_address and not options.given("local_addr"):
        given["local_addr"] = iface_address  # the address other nodes reach this one at
    elif options.max_nodes == 1 and not options.given("local_addr"):
        # The workers' MASTER_ADDR, where the agent's store listens (store_listen): loopback,
        # not the hostname's address (torch's default), which may face the outside.
        given["local_addr"] = "127.0.0.1"
    if options.max_nodes > 1 or options.timeout is not None:
        # Only then: on one node no rendezvous waits for anyone, and the plan stays short.
        static = given.get("rdzv_backend", "static") == "static"
        static = static and not (standalone or given.get("standalone"))  # standalone is c10d
        conf = str(given.get("rdzv_conf") or "")
        given["rdzv_conf"] = rendezvous_conf(conf, timeout_s, static=static)
    args = [f"--nproc-per-node={nproc}"]
    args += torchrun_argv(given, get_args_parser()._actions)
    if standalone:
        args.append("--standalone")
    return [*args, options.script, *options.script_args]

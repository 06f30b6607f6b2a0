"""``multigpu doctor [--json]``: run the checks, print the table (or JSON), exit 0 / 1 / 2.

On its own, the doctor checks this machine and starts its own 2-process all-reduce; inside a
job launched by torchrun or ``multigpu run`` (``RANK``/``WORLD_SIZE`` set, world size > 1) it
runs on every rank, probes across them and compares the nodes (see ``collective.run_ranks``).

This process never initialises CUDA when on its own: GPUs come from NVML / nvidia-smi and the
CUDA facts from a child process. A launched rank is a worker, and asks torch.cuda itself.

Environment variables read: the whole environment is checked (see the check modules:
``OMP_NUM_THREADS``, ``LOCAL_WORLD_SIZE``, ``CUDA_VISIBLE_DEVICES``, ``GLOO_SOCKET_IFNAME``,
``NCCL_SOCKET_IFNAME``, ``MASTER_ADDR``, ``MASTER_PORT``, ``MULTIGPU_CPU_ALLOCATOR``,
``LD_PRELOAD``, torchrun/SLURM/MPI/Ray Train variables);
``MULTIGPU_DEVICE`` (``cpu``: a launched rank stays on the CPU, as ``multigpu run --cpu`` asks).
"""

from __future__ import annotations

import os
import socket
from argparse import Namespace
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from multigpu.common.arguments import Parser, number_arg
from multigpu.common.host import read_interfaces
from multigpu.errors import UsageError

if TYPE_CHECKING:
    from multigpu.diagnostics.doctor.checks import Check
    from multigpu.env import ClusterEnv

PROG = "multigpu doctor"


def build_doctor_parser() -> Parser:
    """The parser of ``multigpu doctor``."""
    p = Parser(
        prog=PROG,
        description="Check this machine for distributed training and say how to fix what is "
        "wrong: versions of Python, torch, CUDA, NCCL and the driver; GPUs (free memory, "
        "utilisation, processes, topology); cores and threads per process; /dev/shm; network "
        "interfaces and MTUs; the launch environment and the rendezvous port. Then a short "
        "all-reduce between 2 processes proves the process group works and reports its bus "
        "bandwidth. Every row is OK, WARN, FAIL or SKIP; every WARN and FAIL says the fix. "
        "Run on every node with `multigpu run [--nnodes N ...] -m multigpu doctor`, the ranks "
        "all-reduce across each other and rank 0 compares their versions and MTUs. "
        "Exit code: 0 when nothing FAILs, 1 when something does, 2 for a usage error.",
    )
    p.add_json()
    p.add_argument("--no-probe", dest="probe", action="store_false", help="skip the all-reduce")
    p.add_argument(
        "--backend",
        choices=("auto", "gloo", "nccl"),
        default="auto",
        help="the all-reduce's backend (default auto: nccl when GPUs are visible, else gloo)",
    )
    p.add_argument(
        "--nproc",
        type=number_arg(int, 2),
        metavar="N",
        help="processes of the all-reduce on one machine (default 2, or the GPUs if fewer)",
    )
    p.add_timeout(60, "bound on the all-reduce, start-up included, and on each collective")
    return p


def parse_doctor_args(argv: Sequence[str]) -> Namespace:
    """Parse ``multigpu doctor``'s options (``--help`` raises SystemExit(0) after printing):
    ``as_json``, ``probe``, ``backend``, ``nproc`` (None: 2, or the GPUs if fewer), ``timeout``."""
    return build_doctor_parser().parse_args(list(argv))


def doctor_main(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> int:
    """``multigpu doctor ARGV``: print the checks; 0 when none FAILs, else 1."""
    from multigpu.diagnostics.doctor.checks import document, print_json, print_table
    from multigpu.diagnostics.doctor.network import env_check

    options = parse_doctor_args(argv)
    env_vars = os.environ if environ is None else environ
    detected = env_check(env_vars)[1]  # None when the launcher's variables do not add up
    # Inside a job of 2+ ranks started by torchrun (`multigpu run`): the doctor runs on each.
    launched = detected is not None and detected.source == "torchrun" and detected.world_size > 1
    if options.nproc is not None and launched:
        raise UsageError(
            f"--nproc {options.nproc} was given to a doctor started by a launcher; expected it "
            "only when the doctor starts its own probe: under a launcher the probe runs across "
            "the launched ranks; drop --nproc (choose the processes with the launcher's options)"
        )
    rows, env, facts = _local(env_vars)
    ranks: list[dict[str, Any]] = []
    if launched and env is not None:
        import torch

        from multigpu.diagnostics.doctor.collective import run_ranks

        backend = _choose_backend(options, facts, env_vars)
        device = torch.device("cuda", env.local_rank) if backend == "nccl" else torch.device("cpu")
        shared = {k: facts[k] for k in ("rank", "host", "versions", "iface", "mtu")}
        rows, ranks = run_ranks(
            shared,
            rows,
            backend=backend,
            device=device,
            timeout=options.timeout,
            store=f"{env.master_addr}:{env.master_port}",
            probe=options.probe,
        )
    else:
        rows.append(
            _probe_row(
                options, facts, env_vars, one_rank=env is not None and env.source == "torchrun"
            )
        )
    doc = document(
        rows,
        host=socket.gethostname(),
        mode="ranks" if launched else "single",
        world_size=env.world_size if launched and env is not None else 1,
        ranks=ranks,
    )
    if not launched or env is None or env.rank == 0:
        (print_json if options.as_json else print_table)(doc)
    return int(doc["exit_code"])


def _local(environ: Mapping[str, str]) -> tuple[list[Check], ClusterEnv | None, dict[str, Any]]:
    """Every local row, the detected environment, and this process's facts for the ranks."""
    import torch

    from multigpu.diagnostics.doctor import cuda, engine, network, ray_worker, system
    from multigpu.gpus import read_facts
    from multigpu.gpus.torch_probe import has_gpu_device_node
    from multigpu.gpus.visible import visible_devices

    interfaces = read_interfaces()
    launch_rows, env = network.launch_checks(environ, interfaces)
    worker = env is not None and env.source == "torchrun"
    gpu_facts = read_facts(environ)  # GPUs, driver and links in one NVML session
    driver = gpu_facts.driver
    visible = len(visible_devices(gpu_facts.inventory, environ))
    hip = getattr(torch.version, "hip", None)
    facts = None
    if (torch.version.cuda or hip) and has_gpu_device_node():
        # A launched rank may use CUDA itself; the launcher's process never does.
        facts = cuda.torch_cuda_facts() if worker else cuda.cuda_facts_in_child(environ)
    rows = [
        *system.software_checks(),
        *cuda.cuda_checks(
            torch_version=torch.__version__,
            build_cuda=torch.version.cuda,
            build_hip=hip,
            gpus=visible,
            facts=facts,
            driver=driver,
        ),
        *cuda.gpu_checks(gpu_facts, environ),
        *system.cpu_checks(environ),
        system.shm_check(*system.read_shm()),
        *network.interface_rows(interfaces),
        network.mtu_check(interfaces),
        network.ifname_check("GLOO_SOCKET_IFNAME", environ, interfaces),
        network.ifname_check("NCCL_SOCKET_IFNAME", environ, interfaces),
        *launch_rows,
        *engine.engine_rows(environ, interfaces),  # a pod's PET_* or SkyPilot's variables
        *ray_worker.ray_rows(environ, env),  # a TorchTrainer worker: Ray's rows
    ]
    used = network.used_interface(environ, interfaces)
    rank_facts = {
        "rank": env.rank if env is not None else 0,
        "host": socket.gethostname(),
        "versions": {
            **system.version_facts(),
            "CUDA runtime": torch.version.cuda or hip or "none",
            "NCCL": (facts.nccl if facts else None) or "none",
            "driver": driver.version if driver else "none",
        },
        "iface": used.name if used else None,
        "mtu": used.mtu if used else None,
        "gpus": visible,
        "cuda": bool(facts and facts.available and facts.nccl),
    }
    return rows, env, rank_facts


def _choose_backend(
    options: Namespace, facts: Mapping[str, Any], environ: Mapping[str, str]
) -> str:
    if options.backend != "auto":
        return options.backend
    if environ.get("MULTIGPU_DEVICE") == "cpu":  # `multigpu run --cpu`: the ranks stay on CPUs
        return "gloo"
    return "nccl" if facts["gpus"] and facts["cuda"] else "gloo"


def _probe_row(
    options: Namespace, facts: Mapping[str, Any], environ: Mapping[str, str], *, one_rank: bool
) -> Check:
    from multigpu.diagnostics.doctor.collective import check_collective_here, skipped

    if not options.probe:
        return skipped("--no-probe was given")
    if one_rank:
        return skipped("launched with one process: launch 2 or more (e.g. --cpu 2) to probe")
    backend = _choose_backend(options, facts, environ)
    default = min(2, facts["gpus"]) if backend == "nccl" and facts["gpus"] else 2
    return check_collective_here(
        backend=backend, nproc=options.nproc or default, timeout=options.timeout, gpus=facts["gpus"]
    )

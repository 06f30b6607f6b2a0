"""Run a launch: check the options, claim GPUs, build the plan, hand it to torch.distributed.run.

The parent process never touches CUDA: GPUs are listed through ``multigpu.gpus`` (NVML /
nvidia-smi) and every worker count handed to torchrun is a number, so torchrun never asks
``torch.cuda`` either. This is the one place in multigpu that writes ``os.environ``: the elastic
agent copies the parent's environment into every worker.

An error of torchrun's agent (rendezvous, store) ends the launch with one line naming the node and
the fix (``describe_agent_error``): torch says "The connection to the C10d store has failed. See
inner exception for details." and leaves the user to dig the address out of a traceback; here
the message names the rendezvous endpoint, this machine, what was waited for and for how long,
and what to check.

Environment variables read: ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``,
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE`` (kept when set), ``CUDA_VISIBLE_DEVICES`` and the
others ``multigpu.gpus`` reads, ``PATH`` (for ``--no-python`` programs), torchrun's ``PET_*`` and
SkyPilot's ``SKYPILOT_*`` (``multigpu.launch.engine_topology``).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from multigpu.common.host import usable_cores
from multigpu.common.run_target import check_script as check_script_path
from multigpu.common.store_reach import StoreUnreachable
from multigpu.errors import MultiGPUError, UsageError
from multigpu.launch import ports
from multigpu.launch.agent import multigpu_agent
from multigpu.launch.cpu_allocator import tbb_libraries
from multigpu.launch.engine_topology import with_engine_topology
from multigpu.launch.failure_summary import (
    USAGE_EXIT_CODE,
    exit_code,
    failures_of,
    log_hint,
    quiet_torch_worker_reports,
    say,
    stopped_line,
    summary_line,
)
from multigpu.launch.options import LaunchOptions
from multigpu.launch.orphans import guard_workers, trace_directory
from multigpu.launch.plan import LaunchPlan, build_plan, request_devices
from multigpu.launch.slurm import with_slurm_topology
from multigpu.launch.stopped_workers import StoppedWorkers
from multigpu.launch.torchrun_numbers import check_torchrun_numbers
from multigpu.replicas.settings import GROUP_ENV

logger = logging.getLogger(__name__)


def check_script(options: LaunchOptions) -> None:
    """Raise UsageError when the script to launch does not exist (before anything starts)."""
    if options.is_module:
        return  # resolved by the workers' own interpreter and sys.path
    script = options.script
    if options.get("no_python") and not options.get("run_path"):
        if shutil.which(script) is None:
            raise UsageError(
                f"program {script!r} (--no-python) was not found; expected an executable path "
                "or a command on PATH; check the spelling"
            )
        return
    check_script_path(script)


@contextmanager
def prepare(options: LaunchOptions) -> Iterator[LaunchPlan]:
    """Check everything, claim the GPUs and yield the plan; the claim is held inside the block.

    Raises:
        UsageError: any bad input (contradicting options, missing script, too few GPUs,
            a port in use, an interface that does not exist); nothing has been started or
            written.
    """
    from multigpu.gpus import claim_gpus, list_gpus, parse_gpu_request, select_gpus

    env = os.environ
    engine = with_engine_topology(options, env)  # PET_* (Kubernetes), SkyPilot's variables
    if engine.line and GROUP_ENV not in env:
        say(engine.line)  # a replica group's launcher: `--replicas`'s launcher said it once
    options = with_slurm_topology(engine.options, env)  # `srun multigpu run`: one per node
    check_torchrun_numbers(options)  # torch asserts some of them only once the agent runs
    cores = usable_cores()
    if options.gpus is not None:
        parse_gpu_request(options.gpus)  # bad syntax ("0,0", "x") before looking at hardware
    gpus = list_gpus(env)
    request = request_devices(options, gpu_count=len(gpus), cores=cores)
    check_script(options)
    address = ports.check_interface(options.iface) if options.iface else None
    libraries = tbb_libraries()
    with ExitStack() as stack:
        if request.kind == "cuda":
            gpu_request = parse_gpu_request(request.gpus)
            if not gpus:
                select_gpus(gpus, gpu_request)  # raises "has none; use --cpu N", locks nothing
            claim = stack.enter_context(claim_gpus(gpu_request, env, gpus=gpus))
            plan = build_plan(
                options,
                request,
                environ=env,
                cores=cores,
                gpus=claim.gpus,
                cuda_visible_devices=claim.cuda_visible_devices,
                iface_address=address,
                tbb_libraries=libraries,
            )
        else:
            plan = build_plan(options, request, environ=env, cores=cores, iface_address=address,
                              tbb_libraries=libraries)  # fmt: skip
        if plan.store_port is not None:
            ports.check_port_free(plan.store_port[1], option=plan.store_port[0])
        endpoint = ports.rendezvous_endpoint(options)
        if endpoint is not None:
            ports.check_store_answers(*endpoint, option=ports.endpoint_option(options),
                                      wait_s=min(plan.timeout_s, 10.0))  # fmt: skip
        yield plan


def launch(plan: LaunchPlan) -> int:
    """Start the workers of ``plan`` through ``torch.distributed.run`` and wait for them.

    Returns:
        0 when every worker succeeded; 1 when one failed (its summary line is written to
        stderr); 128 + signal when the launcher was stopped by a signal.
    """
    from torch.distributed.run import parse_args

    args = parse_args(list(plan.torchrun_args))
    quiet_torch_worker_reports()
    # The only write to os.environ in multigpu: workers inherit the agent's environment.
    os.environ.update(plan.env)
    guard_workers(args, os.environ)  # workers die with this process, even by SIGKILL
    hint = log_hint(args)
    with trace_directory() as traces:
        if args.log_dir is None:  # torch's default is a directory in /tmp left forever
            args.log_dir = os.path.join(traces, "elastic")
        # Each worker keeps its last collectives there; read back if the launch fails.
        os.environ["MULTIGPU_TRACE_DIR"] = traces
        # torchrun's agent with every wait bounded and the nodes checked for agreement
        with multigpu_agent(plan.timeout_s, str(args.nnodes), plan.nproc_per_node) as stopped:
            return _run_agent(args, traces, plan.timeout_s, hint, stopped)


def _run_agent(args: Any, traces: str, timeout_s: float, hint: str, stopped: StoppedWorkers) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import run

    from multigpu.instruments.hang.trace import explain_traces

    try:
        run(args)
        return 0
    except ChildFailedError as e:
        failures = failures_of(e)
        code = exit_code(failures)
        told = failures[0].error is not None and failures[0].error.said_in_full  # a full disk
        # A hang or crash: who waited where (not when a stopped worker held the others up: the
        # line below says it all).
        if code != USAGE_EXIT_CODE and not told and not stopped.found:
            for line in explain_traces(traces):
                sys.stderr.write(line + "\n")
        # One line, last: the cause among the failures, instead of torch's 20-line report
        # (whose traceback the worker already printed above it).
        message = summary_line(failures, log_hint=hint)
        if stopped.found:  # the others' collectives waited for it: it is the cause
            message, code = stopped.line(timeout_s, [f.rank for f in failures]), 1
    except SignalException as e:  # torch's agent passed the signal on to the workers and waited
        say(stopped_line(int(e.sigval), int(args.nproc_per_node)))
        return 128 + int(e.sigval)
    except MultiGPUError as e:  # ours, from inside the agent (the nodes disagree): one line
        message, code = str(e), USAGE_EXIT_CODE if isinstance(e, UsageError) else 1
    except Exception as e:  # rendezvous and agent errors: one line, not torch's traceback
        logger.debug("launch failure", exc_info=True)
        message, code = describe_agent_error(e, args, timeout_s), 1
    say(f"error: {message}")
    return code


def multigpu_run(options: LaunchOptions, *, check: Callable[[LaunchPlan], None]) -> int:
    """What ``multigpu run`` does: prepare, check, log the defaults applied, dry-run or launch."""
    with prepare(options) as plan:
        check(plan)  # a UsageError here: exit code 2, nothing started
        if options.dry_run:  # the notes are part of the plan printed
            print(plan.describe(), flush=True)
            return 0
        for note in plan.notes:
            logger.info("%s", note)
        return launch(plan)


def root_cause(error: BaseException) -> str:
    """``Type: first line`` of the innermost exception of ``error``'s chain."""
    seen: set[int] = set()
    while (error.__cause__ or error.__context__) is not None and id(error) not in seen:
        seen.add(id(error))
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(":. ")


def endpoint_of(args: Any) -> str:
    """The rendezvous endpoint torchrun uses for parsed torchrun ``args``."""
    endpoint = str(getattr(args, "rdzv_endpoint", "") or "")
    if endpoint:
        return endpoint
    return f"{getattr(args, 'master_addr', '127.0.0.1')}:{getattr(args, 'master_port', 29500)}"


def _named_by(args: Any) -> str:
    given = getattr(args, "rdzv_endpoint", "")
    return "--rdzv-endpoint" if given else "--master-addr:--master-port"


def describe_agent_error(error: BaseException, args: Any, timeout_s: float) -> str:
    """The one-line message for ``error`` raised by ``torch.distributed.run.run(args)``."""
    from torch.distributed.elastic.rendezvous.api import (
        RendezvousClosedError,
        RendezvousConnectionError,
        RendezvousTimeoutError,
    )

    endpoint = endpoint_of(args)
    here = socket.gethostname()
    cause = root_cause(error)
    nnodes = getattr(args, "nnodes", "?")
    # Another node's launcher ends first when it gave up waiting for the nodes; which of the
    # endings below this node sees is a race, so each names this node's --nnodes.
    same_options = (
        f"when it timed out waiting for the other nodes, the nodes disagree on --nnodes (this "
        f"node, {here}: --nnodes {nnodes}), --rdzv-id or --rdzv-endpoint: start every node with "
        "the same ones"
    )
    host = endpoint.rsplit(":", 1)[0]
    if isinstance(error, StoreUnreachable):  # our wait before torch's client dials
        return (
            f"{here} waited {timeout_s:g} s (--timeout) for the rendezvous store at "
            f"{error.host}:{error.port} ({_named_by(args)} {endpoint}) and nothing "
            f"answered ({error.last_error}): {host} is down or cut off, or its `multigpu run` "
            "(node rank 0, which hosts the store) is not started or has ended; start it, check "
            "the address and port, the network between the nodes (--iface) and that every node "
            "gives the same endpoint"
        )
    joined = re.search(r"(\d+)/(\d+) clients joined", f"{error} {cause}")
    if joined:  # this node hosts the store (static rendezvous, node rank 0): nobody came
        return (
            f"{here} hosts the rendezvous store at {endpoint} and waited {timeout_s:g} s "
            f"(--timeout) for the other nodes' launchers to connect: only {joined[1]} of "
            f"{joined[2]} did (--nnodes {nnodes}): start `multigpu run` on every node with the "
            f"same --nnodes and {_named_by(args)} {endpoint} and its own --node-rank, or raise "
            "--timeout"
        )
    if isinstance(error, RendezvousTimeoutError):
        return (
            f"not every node joined the rendezvous at {endpoint} within {timeout_s:g} s "
            f"({cause}); {here} expected --nnodes {nnodes}: start `multigpu run` with the same "
            "--rdzv-endpoint, --rdzv-id and --nnodes on every node, or raise --timeout"
        )
    if isinstance(error, RendezvousClosedError):
        return (
            f"the rendezvous at {endpoint} is closed: another node's launcher ended the job "
            f"({cause}) — see its output; {same_options}, and a new --rdzv-id"
        )
    text = f"{type(error).__name__}: {error} {cause}".lower()
    store_lost = isinstance(error, RendezvousConnectionError) or any(
        word in text for word in ("connect", "timed out", "timeout", "no route", "broken pipe")
    )
    if store_lost and any(w in text for w in ("likely closed", "connection reset", "eof")):
        # The store answered before and then hung up: its host's launcher ended.
        return (
            f"the rendezvous store at {endpoint} closed its connection to {here} ({cause}): "
            f"the `multigpu run` on {host} has ended — see its output; {same_options}"
        )
    if store_lost:
        return (
            f"the rendezvous store at {endpoint} is unreachable from {here} ({cause}; waited "
            f"up to --timeout {timeout_s:g} s): {host} is down or cut off, or its `multigpu run` "
            "is not started or has ended (the node at that address hosts the store; the job "
            "cannot go on without it, restarts included); check the address and port, the "
            "network between the nodes (--iface) and that every node gives the same "
            "--rdzv-endpoint"
        )
    return f"the launch failed: {type(error).__name__}: {error}"

"""``multigpu.init()``: detect the job, pick the device, start the group, seed, give a Context.

Every variable is read from the ``environ`` given (default ``os.environ``) and nowhere else, the
``MULTIGPU_*`` ones once, into ``multigpu.common.variables.Settings``. A bad value is a UsageError
before anything starts; in a launched worker it ends the worker with one line and exit code 2.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path

import torch

from multigpu.common import variables
from multigpu.common.log import warn_once
from multigpu.common.profile_window import parse_window
from multigpu.common.quick_exit import skip_final_collection
from multigpu.common.tracker_names import parse_trackers
from multigpu.common.variables import Settings
from multigpu.common.versions import local_versions, mismatch_message
from multigpu.env import detect
from multigpu.env.types import ClusterEnv
from multigpu.errors import EnvError, UsageError
from multigpu.instruments.bench_record import BenchRecorder
from multigpu.instruments.compile_record import CompileReport
from multigpu.instruments.hang import peers
from multigpu.instruments.hang.hooks import HangHook
from multigpu.instruments.hang.watchdog import start_watchdog
from multigpu.instruments.hooks import Hook
from multigpu.instruments.profile_record import ProfileHook
from multigpu.instruments.tracking import DEFAULT_LOG_DIR, LogCheck, Tracking
from multigpu.instruments.tracking.to_ray import RayReport, check_ray_worker
from multigpu.instruments.verify_record import VerifyRecorder
from multigpu.replicas import read_replicas
from multigpu.replicas.hook import replica_hook
from multigpu.runtime import dist
from multigpu.runtime.device import backend_for, rank_device
from multigpu.runtime.precision import Precision
from multigpu.runtime.seed import seed_everything
from multigpu.session.context import Context, report_failure
from multigpu.strategies import Strategy, resolve_strategy
from multigpu.strategies.compose import resolve_backend

log = logging.getLogger(__name__)


def init(
    strategy: str | Strategy | None = None,
    *,
    accelerator: str = "auto",
    backend: str | None = None,
    seed: int | None = 0,
    timeout: float | timedelta | None = None,
    sync_batchnorm: bool = False,
    precision: str | int = "32",
    deterministic: bool | None = None,
    environ: Mapping[str, str] | None = None,
    flops_per_token: float | None = None,
    profile: str | None = None,
    profile_dir: str | os.PathLike[str] | None = None,
    log_to: str | Sequence[str] | None = None,
    log_dir: str | os.PathLike[str] | None = None,
    config: Mapping[str, object] | None = None,
    compile: bool | str | None = None,
) -> Context:
    """Set this process up for data-parallel training and return its Context.

    Works unchanged under ``multigpu run``, ``torchrun``, ``srun``, ``mpirun`` or plain ``python``
    (world size 1: no process group is created and every collective is a no-op).

    Args:
        strategy: ``"auto"`` (above one process DDP, or FSDP when the model does not fit a
            rank under DDP; else single), ``"single"``, ``"dp"`` (DataParallel, legacy),
            ``"ddp"``, ``"fsdp"`` (sharded, FSDP2), or a configured ``Strategy`` such as
            ``DDPStrategy(find_unused_parameters=True)`` or ``FSDPStrategy(blocks=(Block,))``.
            Default: ``MULTIGPU_STRATEGY`` or auto.
        accelerator: ``"auto"`` (CUDA when present), ``"cuda"`` or ``"cpu"``.
        backend: ``"nccl"``, ``"gloo"`` or None (``MULTIGPU_BACKEND``, else nccl for CUDA, gloo
            for CPU).
        seed: seeds python, numpy, torch and CUDA identically on every rank; None leaves them.
        timeout: seconds (or a timedelta) any collective may wait before it fails instead of
            hanging; default ``MULTIGPU_TIMEOUT`` or 300 s. A process group made before this
            call (Ray Train's) is adopted and given this timeout.
        sync_batchnorm: convert BatchNorm layers to SyncBatchNorm in ``setup``.
        precision: ``"32"``, ``"bf16-mixed"`` (autocast to bfloat16; CPU and CUDA) or
            ``"16-mixed"`` (float16 autocast + GradScaler, used by ``ctx.backward``/``ctx.step``).
        deterministic: ``torch.use_deterministic_algorithms(True)`` and no cuDNN autotuning, so
            runs repeat bitwise; default ``MULTIGPU_DETERMINISTIC=1`` (set by ``multigpu verify
            --deterministic``).
        environ: the environment to read (default ``os.environ``).
        flops_per_token: the model's training FLOPs per token (forward and backward), for the
            MFU of ``ctx.throughput()``; default 6 x the parameters given to ``ctx.setup``
            (plus the attention term when the model's ``config`` gives its shape).
        profile: ``"FIRST:LAST"``: trace those optimizer steps (counted from 1) with
            ``torch.profiler`` into ``profile_dir``, one Chrome-trace JSON per rank; default
            ``MULTIGPU_PROFILE``.
        profile_dir: where the traces go; default ``MULTIGPU_PROFILE_DIR``, else ``./profile``.
        log_to: experiment trackers ``ctx.log`` writes to, from rank 0: ``"tensorboard,csv"``
            or a sequence of ``tensorboard``, ``csv``, ``mlflow``, ``wandb``; default
            ``MULTIGPU_LOG_TO``, else none. ``ray`` (in a Ray Train worker) reports what
            ``ctx.log`` got through ``ray.train.report``, from every rank, before each
            checkpoint save and at the end.
        log_dir: the trackers' directory, one run in it; a job resuming there continues that
            run. Default ``MULTIGPU_LOG_DIR``, else ``runs``.
        config: the run's hyperparameters (names to numbers, strings, bools), recorded by
            each tracker with the job's environment (world size, strategy, versions, ...).
        compile: ``torch.compile`` each block of the model ``ctx.setup`` wraps (the units FSDP
            shards; a model without blocks whole), after activation checkpointing and before
            ``fully_shard`` / DDP (``multigpu.strategies.compose``): True (inductor), a backend
            name (``"aot_eager"``), or False. Default ``MULTIGPU_COMPILE``, else off. Rank 0
            prints the compile time and the graph breaks after the first step.

    Raises:
        UsageError: a bad argument or ``MULTIGPU_*`` value (``MULTIGPU_STRATEGY=bogus``);
            nothing has started yet. A worker launched by torchrun (``multigpu run``) ends
            instead: one line, exit code 2.

    Example:
        >>> import multigpu
        >>> with multigpu.init(seed=0) as ctx:
        ...     print(ctx.world_size, ctx.device)
        1 cpu
    """
    env_vars = os.environ if environ is None else environ
    env = detect(env_vars)
    try:  # every choice read and checked before anything starts (a device, a process group)
        settings = Settings.read(env_vars)  # every MULTIGPU_* value, once; nothing else reads
        device = rank_device(env, accelerator, settings)
        chosen_backend = backend_for(device, backend or settings.backend)
        resolved = resolve_strategy(strategy or settings.strategy, env.world_size, env_vars)
        mixed = Precision(precision, device)
        chosen_compile = resolve_backend(
            settings.compile if compile is None else compile, given_as="compile"
        )
        resolved.bind(
            device,
            env.world_size,
            sync_batchnorm=sync_batchnorm,
            precision=mixed,
            compile=chosen_compile,
        )
        wait = dist.collective_timeout(timeout, settings.timeout_s)
        window = _profile_window(profile) if profile is not None else settings.profile
        traces = Path(profile_dir or settings.profile_dir or "profile")
        if window is not None:
            writable(
                traces, "profile directory", "give another profile_dir= or MULTIGPU_PROFILE_DIR"
            )
        if flops_per_token is not None and not (
            isinstance(flops_per_token, int | float) and flops_per_token > 0
        ):
            raise UsageError(
                f"init(flops_per_token={flops_per_token!r}); expected a positive number: the "
                "model's training FLOPs per token (about 6 x its parameters)"
            )
        if deterministic is None:
            deterministic = settings.deterministic
        replicas = read_replicas(env_vars)
        # Under replica groups one group's rank 0 writes the trackers' run (group 0, through
        # its restarts): the groups log the same steps, into the same directory.
        writes = replicas is None or replicas.group == 0
        tracking = choose_tracking(log_to, log_dir, config, settings, env, writes=writes)
        reporting = choose_ray_report(log_to, settings, env)
        if seed is not None:
            seed_everything(seed)  # refuses seed=-1
    except UsageError as e:
        report_failure(e, env)
        raise
    skip_final_collection()  # 0.5-1 s of CPU at the exit of every worker
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if deterministic:
        make_deterministic(device, env_vars)
    created = dist.init_process_group(env, device, chosen_backend, wait)
    if not created and resolved.needs_process_group and not dist.is_initialized():
        created = dist.init_single_process_group(device, chosen_backend, wait)
    check_same_versions()
    # Gradient compression in effect (none at world size 1): verify names it on a FAIL.
    compression = resolved.describe().get("compression", "none") if env.world_size > 1 else "none"
    info = {"precision": mixed.name, "deterministic": deterministic, "compression": compression}
    hooks = choose_hooks(env_vars, env, timeout=wait, info=info)
    if replicas is not None:  # `multigpu run --replicas R`: this worker is in one replica group
        hooks.append(replica_hook(replicas, env, device, wait.total_seconds()))
    if window is not None:
        hooks.append(ProfileHook(window, traces, env.rank, env.world_size))
    if tracking is not None:
        hooks.append(tracking)
    if reporting is not None:
        hooks.append(reporting)
    if chosen_compile is not None:
        hooks.append(CompileReport(chosen_compile))
    log.debug("initialised %s on %s (%s)", env, device, chosen_backend)
    return Context(
        env=env,
        device=device,
        strategy=resolved,
        backend=chosen_backend if env.world_size > 1 else None,
        timeout=wait,
        seed=seed,
        owns_process_group=created,
        precision=mixed,
        hooks=hooks,
        flops_per_token=flops_per_token,
    )


def _profile_window(profile: str) -> tuple[int, int]:
    """``init(profile=...)`` read, or a UsageError."""
    try:
        return parse_window(
            str(profile), given=f"init(profile={profile!r})", example='init(profile="3:5")'
        )
    except ValueError as e:
        raise UsageError(str(e)) from e


def choose_tracking(
    log_to: str | Sequence[str] | None,
    log_dir: str | os.PathLike[str] | None,
    config: Mapping[str, object] | None,
    settings: Settings,
    env: ClusterEnv,
    *,
    writes: bool = True,
) -> Tracking | LogCheck | None:
    """Rank 0's trackers (elsewhere, or where ``writes`` is false, the check of ``ctx.log``'s
    values alone; None with no tracker asked for), checked before anything starts: the names,
    their packages, ``config``, and a log directory rank 0 can write. ``ray`` is not one of
    them: it reports from every rank (``choose_ray_report``)."""
    names = settings.log_to if log_to is None else parse_trackers(log_to, "log_to=")
    if config is not None and not (
        isinstance(config, Mapping) and all(isinstance(k, str) for k in config)
    ):
        raise UsageError(
            f"config={config!r}: expected a mapping of hyperparameter names (strings) to "
            "values, e.g. config={'lr': 3e-4, 'batch_size': 64}"
        )
    names = tuple(n for n in names if n != "ray")
    if not names:
        return None
    if env.rank != 0 or not writes:
        return LogCheck()  # a bad value is refused on every rank alike
    directory = Path(log_dir or settings.log_dir or DEFAULT_LOG_DIR)
    writable(directory, "log directory", "give another log_dir= or MULTIGPU_LOG_DIR")
    return Tracking(names, directory, config=config, restarts=env.restart_count)


def choose_ray_report(
    log_to: str | Sequence[str] | None, settings: Settings, env: ClusterEnv
) -> RayReport | None:
    """Every rank's ``ray.train.report`` of ``ctx.log`` when ``ray`` is among the trackers (Ray's
    report is a barrier of every worker), refused in one line outside a Ray Train worker."""
    names = settings.log_to if log_to is None else parse_trackers(log_to, "log_to=")
    if "ray" not in names:
        return None
    check_ray_worker(env.source)
    return RayReport()


def writable(directory: Path, what: str, fix: str) -> None:
    """Make ``directory`` (and its parents) and write a file in it, or refuse in one line: a
    place found unwritable only when the run writes there fails after the training it records.
    The rank probes ``.multigpu-write-check.<pid>`` (ranks of one node may share the place)."""
    probe = directory / f".multigpu-write-check.{os.getpid()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe.touch()
        probe.unlink()
    except OSError as e:
        raise UsageError(
            f"{what} {directory}: cannot write there ({e.strerror or e}); expected a "
            f"directory this user can write; {fix}"
        ) from e


def choose_hooks(
    environ: Mapping[str, str],
    env: ClusterEnv,
    *,
    timeout: timedelta,
    info: dict[str, object],
) -> list[Hook]:
    """This worker's hooks (``multigpu.instruments.hooks``), started, chosen by the variables the
    launcher set: the verify probe or bench's step timer (``verify_or_bench``); above one process
    the hang tools. ``info``: what the verify probe records of the run."""
    recorder = verify_or_bench(environ, env.rank, env.world_size)  # a bad step count: now
    hooks: list[Hook] = []
    if env.world_size > 1:  # a liveness port per rank: after a failure, who is lost
        peers.start(env.rank, dist.gather_objects_small, env.master_addr)
        watchdog = start_watchdog(
            rank=env.rank, world_size=env.world_size, timeout=timeout, environ=environ
        )
        hooks.append(HangHook(watchdog, timeout))
    if recorder is not None:
        recorder.info.update(info)
        hooks.append(recorder)
    return hooks


def verify_or_bench(
    environ: Mapping[str, str], rank: int, world_size: int
) -> VerifyRecorder | None:
    """The probe of ``multigpu verify`` (``MULTIGPU_VERIFY_DIR``), else the step timer of
    ``bench scaling`` (``MULTIGPU_BENCH_DIR``), else None."""
    for directory, steps, kind in (
        ("MULTIGPU_VERIFY_DIR", "MULTIGPU_VERIFY_STEPS", VerifyRecorder),
        ("MULTIGPU_BENCH_DIR", "MULTIGPU_BENCH_STEPS", BenchRecorder),
    ):
        if environ.get(directory):
            count = variables.read_count(environ, steps)
            return kind(Path(environ[directory]), count, rank, world_size)
    return None


def check_same_versions() -> None:
    """Compare every rank's versions (one small all-gather); raise EnvError on a mismatch."""
    if dist.world_size() < 2:
        return
    found = dist.gather_objects_small({"host": socket.gethostname(), "versions": local_versions()})
    message = mismatch_message(found)
    if message is not None:
        raise EnvError(message)


def make_deterministic(device: torch.device, environ: Mapping[str, str]) -> None:
    """Ask torch for deterministic kernels (an error where an op has none) and no autotuning."""
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    if device.type == "cuda" and not environ.get("CUBLAS_WORKSPACE_CONFIG"):
        # cuBLAS reads it when CUDA starts: only the launcher can set it in time.
        warn_once(
            log,
            "deterministic=True on CUDA without CUBLAS_WORKSPACE_CONFIG: cuBLAS may still be "
            "nondeterministic; launch with `multigpu verify --deterministic` or export "
            "CUBLAS_WORKSPACE_CONFIG=:4096:8",
        )

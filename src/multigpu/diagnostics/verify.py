"""``multigpu verify``: prove that a script gives the same results at every world size.

For each world size N of ``--nproc`` it runs ``python -m multigpu run --cpu N script ...`` (on a
machine with CUDA GPUs ``--gpus N``) in a child process, with ``MULTIGPU_VERIFY_DIR`` and
``MULTIGPU_VERIFY_STEPS`` set so that ``multigpu.init()`` records every optimizer step, the losses
given to ``ctx.backward``, the loaders and the final parameters
(``multigpu.instruments.verify_record``) and stops the script after ``--steps`` steps. With
``--accumulation K,L`` every world size runs at each accumulation too, the script getting
``--accumulation-steps K`` after its arguments. Every run after the first is compared with the first
(``compare``); a failed run is reported by its one-line error, a FAIL is explained from the records
(``diagnose``) and, to tell rounding and world-size effects from plain nondeterminism, the first run
is repeated.

Every child gets one thread per process (``OMP_NUM_THREADS=1``, ``MKL_NUM_THREADS=1``): float
results depend on how a sum is split between threads, so the thread count must not change with
the world size. The children inherit the rest of the environment (``child_env``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path

from rich.console import Console

from multigpu.diagnostics.child_run import run_child
from multigpu.diagnostics.compare import (
    ADAPTIVE_L2_RTOL,
    Tolerance,
    compare_runs,
    default_rtol,
    gradient_dtype,
)
from multigpu.diagnostics.diagnose import (
    adaptive_note,
    find_notes,
    find_reasons,
    nondeterminism_reason,
    unexplained,
)
from multigpu.diagnostics.options import VerifyOptions, device_for_runs
from multigpu.diagnostics.records import RunRecord, load_run, run_label
from multigpu.diagnostics.report import RunOutcome, VerifyResult, render, to_json
from multigpu.launch.engine_topology import one_machine_env

log = logging.getLogger(__name__)


def child_env(
    environ: Mapping[str, str], directory: Path, steps: int, *, device: str, deterministic: bool
) -> dict[str, str]:
    """The environment of one run: the caller's plus what verify needs.

    Example:
        >>> env = child_env({}, Path("/tmp/ws2"), 20, device="cpu", deterministic=False)
        >>> env["MULTIGPU_VERIFY_STEPS"], env["OMP_NUM_THREADS"], env["GLOO_SOCKET_IFNAME"]
        ('20', '1', 'lo')
    """
    env = one_machine_env(environ)  # this machine's runs, also in a pod of a multi-node job
    env.update(
        MULTIGPU_VERIFY_DIR=str(directory),
        MULTIGPU_VERIFY_STEPS=str(steps),
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
    )
    if device == "cpu":
        env["GLOO_SOCKET_IFNAME"] = "lo"  # one machine: loopback, whatever the host's name says
    if deterministic:
        env["MULTIGPU_DETERMINISTIC"] = "1"
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # read by cuBLAS at CUDA start: set it here
    return env


def verify_argv(
    options: VerifyOptions, world_size: int, device: str, accumulation: int | None = None
) -> list[str]:
    """The ``multigpu run`` command line of one run.

    Example:
        >>> opts = VerifyOptions(target="train.py", is_module=False, script_args=("--lr", "1"))
        >>> verify_argv(opts, 2, "cpu")[1:]
        ['-m', 'multigpu', 'run', '--cpu', '2', 'train.py', '--lr', '1']
        >>> verify_argv(opts, 1, "cpu", accumulation=4)[-2:]
        ['--accumulation-steps', '4']
    """
    devices = ["--gpus" if device == "cuda" else "--cpu", str(world_size)]
    target = ["-m", options.target] if options.is_module else [options.target]
    script = [*target, *options.script_args]
    if accumulation is not None:
        script += ["--accumulation-steps", str(accumulation)]
    return [sys.executable, "-m", "multigpu", "run", *devices, *script]


def run_error(reason: str, stderr: str) -> str:
    r"""The one line that says why a run failed: the launcher's summary (``rank R on HOST
    failed: Type: message``) without what only a terminal would show, and the worker's last
    line of output where the summary has only an exit code.

    Example:
        >>> run_error("multigpu: error: rank 1 on vm failed: ValueError: bad; its output is "
        ...           "above", "")
        'rank 1 on vm failed: ValueError: bad'
        >>> run_error("multigpu: error: rank 0 on vm exited with code 1; its output is above",
        ...           "boom: the script broke\nmultigpu: error: rank 0 on vm exited with code 1")
        'rank 0 on vm exited with code 1 (its last line: boom: the script broke)'
    """
    text = reason.removeprefix("multigpu: error: ").removesuffix("; its output is above")
    if text and not _NO_MESSAGE.search(text):
        return text
    own = [line.strip() for line in stderr.splitlines() if line.strip()]
    last = next((line for line in reversed(own) if not line.startswith("multigpu:")), "")
    if not last:
        return text
    return f"{text} (its last line: {last})" if text else last


_NO_MESSAGE = re.compile(r"^rank \d+ on \S+ (exited with code|was killed by) ")
"""The launcher's summary of a worker that recorded no error (``sys.exit``, a signal)."""


def run_once(
    options: VerifyOptions,
    world_size: int,
    device: str,
    directory: Path,
    accumulation: int | None = None,
) -> tuple[RunOutcome, RunRecord | None]:
    """Run the script at one world size (and accumulation) with the probe on; its records are
    left in ``directory``."""
    if directory.exists():
        shutil.rmtree(directory)  # a kept directory of an earlier verify must not be read
    directory.mkdir(parents=True)
    command = verify_argv(options, world_size, device, accumulation)
    env = child_env(
        os.environ, directory, options.steps, device=device, deterministic=options.deterministic
    )
    if options.strategy is not None:
        env["MULTIGPU_STRATEGY"] = options.strategy  # for a script that leaves it to init()
    what = "GPU(s), nccl" if device == "cuda" else "CPU process(es), gloo"
    label = run_label(world_size, accumulation)
    log.info("verify: %s (%s %s) ...", label, world_size, what)
    run = run_child(command, env, timeout=options.timeout, logs=directory)
    code, seconds = run.returncode, run.seconds
    log.info("verify: %s finished in %.1f s (exit code %s)", label, seconds, code)
    outcome = RunOutcome(
        world_size=world_size,
        returncode=code,
        seconds=seconds,
        command=tuple(command),
        stderr_tail=run.stderr_tail,
        error=run_error(run.reason, run.stderr_tail) if code else "",
        accumulation=accumulation,
    )
    return outcome, load_run(directory, world_size, accumulation) if code == 0 else None


def _runs(options: VerifyOptions) -> list[tuple[int, int | None]]:
    """(world size, accumulation) of every run, the reference first."""
    return [(n, k) for k in options.accumulation or (None,) for n in options.nproc]


def _directory(root: Path, world_size: int, accumulation: int | None) -> Path:
    return root / (f"ws{world_size}" + ("" if accumulation is None else f"-acc{accumulation}"))


def verify(options: VerifyOptions, root: Path) -> VerifyResult:
    """Run every world size, compare with the first, explain a FAIL (re-running the first).

    The runs write their records and logs under ``root`` (``ws{N}/``).
    """
    device = device_for_runs(options.nproc, cpu=options.cpu, given=options.nproc_given)
    outcomes: list[RunOutcome] = []
    records: list[RunRecord] = []
    reasons: list[str] = []
    for n, k in _runs(options):
        outcome, record = run_once(options, n, device, _directory(root, n, k), k)
        outcomes.append(outcome)
        if outcome.returncode != 0:
            why = outcome.error or "see the end of its stderr"
            reasons.append(
                f"the run at {outcome.label} failed (exit code {outcome.returncode}): {why}; "
                "fix it first (try it with 'multigpu run')"
            )
            break
        if record is None:
            reasons.append(
                f"the run at {outcome.label} wrote no record: the script must call "
                "multigpu.init() (the records are taken there)"
            )
            break
        records.append(record)
    ref = records[0] if records else None
    rtol = options.rtol
    if rtol is None:
        rtol = default_rtol(ref.dtype, ref.precision) if ref else default_rtol(None, None)
    adaptive = ref.adaptive if ref is not None and options.rtol is None else []
    tol = Tolerance(rtol=rtol, atol=options.atol, l2_rtol=ADAPTIVE_L2_RTOL if adaptive else None)
    comparisons = tuple(compare_runs(run, records[0], tol) for run in records[1:])
    notes = find_notes(records, options.steps)
    if adaptive and comparisons:
        notes.append(adaptive_note(adaptive, comparisons, tol))
    result = VerifyResult(
        world_sizes=options.nproc,
        accumulation=options.accumulation,
        device=device,
        steps_requested=options.steps,
        tolerance=tol,
        deterministic=options.deterministic,
        runs=tuple(outcomes),
        comparisons=comparisons,
        notes=tuple(notes),
        directory=str(root) if options.keep else None,
        gradient_dtype=gradient_dtype(ref.dtype, ref.precision) if ref else "float32",
    )
    if not (result.passed or reasons or ref is None):
        reasons.extend(find_reasons(records, comparisons))
        again = _rerun(options, device, root, ref, tol)
        if again:  # first: no comparison across world sizes means anything if this holds
            reasons.insert(0, again)
        if not reasons:
            reasons.append(unexplained(comparisons, records))
    return dataclasses.replace(result, reasons=tuple(reasons))


def _and_accumulation(options: VerifyOptions) -> str:
    if options.accumulation is None:
        return ""
    return f" and accumulation steps {', '.join(map(str, options.accumulation))}"


def _rerun(
    options: VerifyOptions, device: str, root: Path, ref: RunRecord, tol: Tolerance
) -> str | None:
    """Run the first run again: a script that differs from itself is the first suspect."""
    n, k = _runs(options)[0]
    log.info("verify: FAIL; running %s again to check it repeats itself", run_label(n, k))
    directory = _directory(root, n, k)
    outcome, record = run_once(
        options, n, device, directory.with_name(directory.name + "-again"), k
    )
    if outcome.returncode != 0 or record is None:
        return (
            f"the second run at {outcome.label} failed (exit code {outcome.returncode}), so "
            "whether the script repeats itself is unknown: "
            + (outcome.error or " | ".join(outcome.stderr_tail.splitlines()[-3:]))
        )
    return nondeterminism_reason(compare_runs(record, ref, tol))


def verify_command(options: VerifyOptions) -> int:
    """``multigpu verify``'s run (parsed by ``multigpu.cli.verify``): 0 PASS, 1 FAIL."""
    with ExitStack() as stack:
        if options.keep is not None:
            root = options.keep.resolve()
            root.mkdir(parents=True, exist_ok=True)
        else:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="multigpu-verify-")))
        result = verify(options, root)
    if options.as_json:
        sys.stdout.write(json.dumps(to_json(result), indent=2) + "\n")
    else:
        what = "GPUs (nccl)" if result.device == "cuda" else "CPU processes (gloo)"
        # soft_wrap: long lines stay whole (greppable); the table still fits the width.
        console = Console(
            file=sys.stdout, width=max(100, shutil.get_terminal_size().columns), soft_wrap=True
        )
        target = f"-m {options.target}" if options.is_module else options.target
        console.print(
            f"verify: {' '.join([target, *options.script_args])} at world sizes "
            f"{', '.join(map(str, result.world_sizes))}{_and_accumulation(options)} on {what}, "
            f"{options.steps} steps each",
            markup=False,
            highlight=False,
        )
        render(result, console)
    sys.stdout.flush()
    return 0 if result.passed else 1

"""What ``multigpu verify`` is asked to do (its command line is ``multigpu.cli.verify``), and the
device a diagnostic runs its world sizes on."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from multigpu.errors import UsageError

log = logging.getLogger(__name__)

VERIFY_STRATEGIES = ("auto", "single", "ddp", "fsdp")
"""What ``--strategy`` accepts (dp is one process: nothing to compare across world sizes)."""
BUILTIN_JOB = ("multigpu.examples.digits", ("--progress", "off"))
"""The job verified when no script is given: the digits CNN, as ``-m`` module and arguments."""


@dataclass(frozen=True, kw_only=True)
class VerifyOptions:
    """What ``multigpu verify`` was asked to do."""

    target: str
    """The script's path, or the module with ``is_module`` (``-m``)."""
    is_module: bool
    script_args: tuple[str, ...] = ()
    nproc: tuple[int, ...] = (1, 2)
    """World sizes, the reference first."""
    accumulation: tuple[int, ...] | None = None
    """Accumulation steps to run every world size at, the reference first: the script gets
    ``--accumulation-steps K`` after its arguments. None: the script's own, once."""
    nproc_given: bool = True
    """``nproc`` was asked for; the default (1, 2) moves to CPU processes where GPUs are fewer."""
    steps: int = 50
    """Optimizer steps recorded at each world size."""
    as_json: bool = False
    deterministic: bool = False
    """Run the workers with deterministic algorithms (``MULTIGPU_DETERMINISTIC=1``)."""
    rtol: float | None = None
    """None: by dtype and precision."""
    atol: float = 0.0
    keep: Path | None = None
    """Keep the run directories here (else a temporary directory removed at the end)."""
    cpu: bool = False
    """CPU processes even on a machine with GPUs."""
    timeout: float = 900.0
    """Seconds one run may take before it is stopped."""
    strategy: str | None = None
    """The strategy of every run (``MULTIGPU_STRATEGY``), for scripts that leave it to init()."""


def device_for_runs(nproc: Sequence[int], *, cpu: bool, given: bool = True) -> str:
    """The device on which a diagnostic (verify, bench scaling) runs its world sizes ``nproc``:
    ``"cuda"`` when the machine has enough GPUs (and not ``cpu``), else ``"cpu"``; a UsageError
    when ``nproc`` was ``given`` and asks for more GPUs than the machine shows."""
    if cpu:
        return "cpu"
    from multigpu.gpus import list_gpus

    count = len(list_gpus())
    if count == 0:
        return "cpu"
    if max(nproc) <= count:
        return "cuda"
    sizes = ",".join(map(str, nproc))
    if not given:
        log.warning(
            "this machine shows %d GPU(s), too few for world sizes %s: comparing CPU processes "
            "(gloo) instead; --cpu says so, --nproc picks other sizes",
            count,
            sizes,
        )
        return "cpu"
    # One GPU leaves nothing to compare on GPUs: only --cpu helps there.
    fix = (
        f"use world sizes up to {count}, or --cpu for CPU processes"
        if count > 1
        else "add --cpu to compare CPU processes (gloo) instead"
    )
    raise UsageError(
        f"--nproc {sizes} asks for {max(nproc)} GPUs but this machine shows {count}; "
        f"expected at most one process per GPU; {fix}"
    )

"""Diagnostics run from the command line: ``multigpu verify`` (world-size invariance, exported
here), ``multigpu doctor`` (``diagnostics.doctor``) and ``multigpu bench`` (``diagnostics.bench``).

Nothing in the library imports this package: it starts workers as subprocesses
(``python -m multigpu run``) and reads what they recorded, so it never imports the training side.
"""

from __future__ import annotations

from multigpu.diagnostics.compare import (
    LossDiff,
    RunComparison,
    TensorDiff,
    Tolerance,
    compare_losses,
    compare_params,
    compare_runs,
    default_rtol,
)
from multigpu.diagnostics.diagnose import find_notes, find_reasons, nondeterminism_reason
from multigpu.diagnostics.options import VerifyOptions
from multigpu.diagnostics.records import RunRecord, load_run
from multigpu.diagnostics.report import RunOutcome, VerifyResult, to_json
from multigpu.diagnostics.verify import verify, verify_command

__all__ = [
    "LossDiff",
    "RunComparison",
    "RunOutcome",
    "RunRecord",
    "TensorDiff",
    "Tolerance",
    "VerifyOptions",
    "VerifyResult",
    "compare_losses",
    "compare_params",
    "compare_runs",
    "default_rtol",
    "find_notes",
    "find_reasons",
    "load_run",
    "nondeterminism_reason",
    "to_json",
    "verify",
    "verify_command",
]

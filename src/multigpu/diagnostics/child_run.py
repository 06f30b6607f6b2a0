"""Start one ``python -m multigpu run ...`` child for verify or bench, and wait for it, bounded.

The child's output goes to log files (its stderr tail is kept for the error message); a child
that overruns its time gets SIGTERM — so the launcher stops its workers, which run in their own
sessions — then SIGKILL after a grace period.
"""

from __future__ import annotations

import logging
import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

TIMED_OUT = 124
"""The exit code given to a child stopped for running too long (as coreutils' ``timeout``)."""

GRACE_SECONDS = 30.0
"""How long a timed-out launcher gets to stop its workers after SIGTERM before SIGKILL."""

TAIL_LINES = 20
"""Lines of a failed child's stderr kept for the report."""


@dataclass(frozen=True, kw_only=True)
class ChildRun:
    """How one child ended."""

    returncode: int
    """The launcher's exit code (``TIMED_OUT`` when stopped for running too long)."""
    seconds: float
    """Wall time from start to exit, start-up included."""
    stderr_tail: str
    """The last lines of its stderr (empty on success)."""
    reason: str = ""
    """The last exception or ``multigpu: error:`` line of its stderr (empty on success)."""


def run_child(
    command: Sequence[str], env: Mapping[str, str], *, timeout: float, logs: Path
) -> ChildRun:
    """Run ``command`` with ``env``; stdout and stderr go to ``{logs}.stdout.log`` and
    ``{logs}.stderr.log``.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     run = run_child(["true"], {}, timeout=5, logs=Path(tmp) / "true")
        >>> run.returncode, run.reason
        (0, '')
    """
    started = time.perf_counter()
    logs.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{logs}.stdout.log", "wb") as out, open(f"{logs}.stderr.log", "w+b") as err:
        proc = subprocess.Popen(list(command), env=dict(env), stdout=out, stderr=err)
        code = _wait(proc, timeout)
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    seconds = time.perf_counter() - started
    log.debug("%s: exit code %s in %.1f s", " ".join(command), code, seconds)
    tail = "\n".join(stderr.rstrip().splitlines()[-TAIL_LINES:]) if code else ""
    reason = find_reason(stderr) if code else ""
    if code == TIMED_OUT:
        reason = f"stopped after {timeout:g} s"
        tail += f"\n({reason})"
    return ChildRun(returncode=code, seconds=seconds, stderr_tail=tail, reason=reason)


# An exception line of a traceback ("[rank1]: multigpu.errors.UsageError: batch_size=...") or
# one of multigpu's one-line errors; torch's failure summary that follows them says less.
_REASON = re.compile(
    r"^(?:\[rank\d+\]:\s*)?((?:[\w.]*(?:Error|Exception|Interrupt)): .+|multigpu: error: .+)$"
)
_SUMMARY = "the workers stopped on a usage error"


def find_reason(stderr: str) -> str:
    r"""The line of a failed child's stderr that says why it failed (empty when none does).

    Example:
        >>> find_reason("Traceback ...\n[rank0]: ValueError: bad\n====\nFailures:")
        'ValueError: bad'
    """
    found = ""
    for line in stderr.splitlines():
        match = _REASON.match(line.strip())
        if match and _SUMMARY not in line:
            found = match.group(1)
    return found


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(timeout=GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return TIMED_OUT
    except BaseException:  # Ctrl-C: stop the launcher (and so its workers) before leaving
        proc.terminate()
        proc.wait()
        raise

"""The one line a failed run ends with: which rank failed first, where, with what.

torch's agent ends a failed run with a 20-line block (``ChildFailedError``) that repeats the
worker's traceback, after which a user had to work out which rank's error was the cause and
which were consequences (a rank whose collective lost its peer fails too, seconds later). Here
each failure is read from the worker's error file (``multigpu.common.worker_error``) and the cause
is chosen: recorded errors before bare exit codes, errors of their own before consequences of
another rank's (a collective whose peer went away, a SIGTERM from the agent stopping the
others), then the earliest. The run's exit code is 2 when the failing workers refused their
input (usage errors, the ranks stopped for them aside), else 1.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from dataclasses import dataclass
from typing import Any

from multigpu.common.worker_error import WorkerError, read

USAGE_EXIT_CODE = 2
MESSAGE_LIMIT = 600  # a full disk's message says where, how much, and what to do


@dataclass(frozen=True)
class Failure:
    """One failed worker as the launcher saw it."""

    rank: int
    exitcode: int
    error: WorkerError | None
    timestamp: float
    error_file: str

    @property
    def stopped_by_agent(self) -> bool:
        """SIGTERM: the agent stopping the others once one failed, not a failure of its own."""
        return self.exitcode == -signal.SIGTERM

    @property
    def usage(self) -> bool:
        """This worker refused its input (a ``UsageError``, exit code 2)."""
        return self.error.usage if self.error is not None else self.exitcode == USAGE_EXIT_CODE

    @property
    def final(self) -> bool:
        """Starting the workers again cannot help: a usage error, or an error that says so
        (``MultiGPUError.final``)."""
        return self.usage or (self.error is not None and self.error.final)

    def cause_order(self) -> tuple[bool, bool, bool, float, int]:
        """Sort key: the likeliest cause of the run's failure first (a rank killed by a signal
        other than the agent's SIGTERM is a cause; a lost peer is a consequence)."""
        consequence = self.error.consequence if self.error is not None else False
        when = self.error.time if self.error is not None else self.timestamp
        return (self.stopped_by_agent, consequence, self.error is None, when, self.rank)


def failures_of(error: Any) -> list[Failure]:
    """The failures of torch's ``ChildFailedError`` (``error.failures``: rank -> ProcessFailure)."""
    found = [
        Failure(
            rank=int(rank),
            exitcode=int(failure.exitcode),
            error=read(getattr(failure, "error_file_data", None)),
            timestamp=float(failure.timestamp),
            error_file=str(failure.error_file),
        )
        for rank, failure in error.failures.items()
    ]
    ordered = sorted(found, key=Failure.cause_order)
    if ordered and ordered[0].error is not None:
        # The same error on several ranks (a usage error every rank raises): name the lowest
        # rank, not whichever happened to record a millisecond earlier.
        same = [f for f in ordered if f.error is not None and _same(f.error, ordered[0].error)]
        lowest = min(same, key=lambda f: f.rank)
        ordered.remove(lowest)
        ordered.insert(0, lowest)
    return ordered


def _same(a: WorkerError, b: WorkerError) -> bool:
    return (a.type, a.message, a.consequence) == (b.type, b.message, b.consequence)


def exit_code(failures: list[Failure]) -> int:
    """2 when every worker that failed of its own refused its input, else 1.

    Set aside: the ranks the agent stopped, and those whose collective lost the refusing rank
    (a peer waiting in a broadcast when rank 0 refused fails with "Connection closed by peer").
    """
    own = [
        f
        for f in failures
        if not f.stopped_by_agent and not (f.error is not None and f.error.consequence)
    ]
    return USAGE_EXIT_CODE if own and all(f.usage for f in own) else 1


def summary_line(failures: list[Failure], *, log_hint: str = "its output is above") -> str:
    """``rank R on HOST failed: Type: message (N other ranks stopped too); <log_hint>``."""
    first = failures[0]
    host = first.error.host if first.error is not None else socket.gethostname()
    if first.error is not None:
        what = f"{first.error.type}: {_one_line(first.error.message)}"
        verb = "" if first.error.usage else " failed"  # a usage error is no crash
        line = f"rank {first.rank} on {host}{verb}: {what}"
    elif first.exitcode < 0:
        name = _signal_name(-first.exitcode)
        line = f"rank {first.rank} on {host} was killed by {name}"
        if first.exitcode == -signal.SIGKILL:
            line += " (often the kernel's out-of-memory killer: see `dmesg`)"
    else:
        line = f"rank {first.rank} on {host} exited with code {first.exitcode}"
        if first.exitcode == USAGE_EXIT_CODE:
            line += " (a usage error)"
        elif first.exitcode > 128:  # the shell's way of saying "ended by a signal"
            line += f" (128 + {_signal_name(first.exitcode - 128)})"
    others = len(failures) - 1
    if others:
        line += f" ({others} other rank{'s' if others > 1 else ''} stopped too)"
    if first.error is not None and first.error.consequence:
        line += "; it lost a peer: the rank that stopped first (on another node?) holds the cause"
    elif first.error is None or not (first.error.usage or first.error.said_in_full):
        line += f"; {log_hint}"
    return line


def _one_line(message: str) -> str:
    text = " ".join(message.split())
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 3] + "..."


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def log_hint(args: Any) -> str:
    """Where the rest of a failed worker's output is: the user's ``--log-dir`` when torchrun
    writes the workers' output there (``--redirects``/``--tee``), else the terminal above."""
    redirected = (
        str(getattr(args, "redirects", "0")) != "0" or str(getattr(args, "tee", "0")) != "0"
    )
    if getattr(args, "log_dir", None) and redirected:
        return f"its output is under {args.log_dir}"
    return "its output is above"


def quiet_torch_worker_reports() -> None:
    """Hide torch's per-worker E/W lines ("failed (exitcode: 1) local_rank: 0 ...", "Sending
    process 123 closing signal SIGTERM"): the summary line says it once. ``LOGLEVEL=INFO`` (torch
    elastic's own variable) keeps them."""
    if "LOGLEVEL" not in os.environ:
        logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(
            logging.CRITICAL
        )
        # "Received 2 death signal, shutting down workers": the launcher says it in its own
        # words (``stopped_line``); the agent's other warnings stay.
        agent_log = logging.getLogger("torch.distributed.elastic.agent.server.api")
        if not any(isinstance(f, _DeathSignalFilter) for f in agent_log.filters):
            agent_log.addFilter(_DeathSignalFilter())


class _DeathSignalFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "death signal" not in str(record.msg)


def stopped_line(signal_number: int, workers: int) -> str:
    """What the launcher says when a signal stopped it (after the workers were stopped).

    Example:
        >>> stopped_line(2, 2)
        'stopped by Ctrl-C (SIGINT): the 2 workers on this node were stopped'
    """
    name = _signal_name(signal_number)
    what = "Ctrl-C (SIGINT)" if signal_number == signal.SIGINT else name
    plural = "the worker" if workers == 1 else f"the {workers} workers"
    return f"stopped by {what}: {plural} on this node were stopped".replace(
        "worker on this node were", "worker on this node was"
    )


def say(line: str) -> None:
    """One line of the launcher's own on stderr, at once."""
    print(f"multigpu: {line}", file=sys.stderr, flush=True)

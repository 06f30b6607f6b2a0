"""The hang watchdog: a thread in every worker that explains a hang before the timeout ends it.

Every ``poll_s`` the thread looks at this rank's collective log. When a collective has waited
``report_after_s`` (half the collective timeout, at most 60 s), the rank raises an alarm in the
process group's store. Every rank's watchdog sees the alarm at its next poll — including a rank
that is in no collective at all, e.g. busy in its own evaluation — and answers with a report:
where its main thread is, the collective it waits in, its last collectives and its per-line call
counts. Each rank prints its own stack to stderr; the lowest rank collects the reports and
prints one summary (``multigpu.instruments.hang.explain``). Then the collective timeout ends the job
as before, so a hang is always both explained and bounded.

A rank stopped by SIGSTOP or Ctrl-Z cannot report: the ranks that wait for it would only say
"no report" in a 20-line summary, then fail with a gloo traceback each. So every rank leaves
its host and pid in the store when it starts, and a stalled rank first looks for a stopped peer
on its own host (``/proc/PID/stat``, state ``T``): when there is one, the run says that in one
line instead, once, and the ranks that wait for it end quietly when the timeout comes
(``stopped_peers``; the launcher's last line names the stopped rank).

Environment variables read: ``MULTIGPU_WATCHDOG`` (``0`` turns it off), ``MULTIGPU_HANG_AFTER``
(seconds before a waiting collective counts as a hang), ``MULTIGPU_TRACE_DIR`` (set by ``multigpu
run``: where each rank keeps its last collectives, read by the launcher after a failure).
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from dataclasses import asdict
from datetime import timedelta
from typing import Any

from multigpu.common import variables
from multigpu.common.process_state import is_stopped
from multigpu.instruments.hang.explain import explain
from multigpu.instruments.hang.recorder import CollectiveLog, user_site
from multigpu.instruments.hang.trace import describe
from multigpu.torch_compat import default_store

log = logging.getLogger(__name__)

PREFIX = "multigpu_hang/"
MAX_REPORT_AFTER_S = 60.0
STOPPED_ALARM = "stopped"
"""The alarm's value when a stalled rank found the peer it waits for stopped, and said so."""
COLLECT_S = 5.0
"""How long the summarising rank waits for the other ranks' reports."""
STOP_WAIT_S = COLLECT_S + 2.0
"""How long ``stop()`` waits for the thread: its store call under way, or a summary it writes."""


def report_after(timeout_s: float, environ: Mapping[str, str]) -> float:
    """Seconds a collective may wait before it counts as a hang.

    Example:
        >>> report_after(300, {}), report_after(20, {})
        (60.0, 10.0)
        >>> report_after(9, {"MULTIGPU_HANG_AFTER": "3"})
        3.0
    """
    after = variables.hang_after(environ)  # a UsageError when not a positive number
    if after is not None:
        return max(0.5, after)
    return min(timeout_s / 2, MAX_REPORT_AFTER_S)


class Watchdog:
    """The per-worker thread; ``start()`` after the process group exists, ``stop()`` before
    it is destroyed."""

    def __init__(
        self,
        collectives: CollectiveLog,
        store: Any,
        *,
        rank: int,
        world_size: int,
        after_s: float,
        poll_s: float = 0.5,
    ) -> None:
        self.collectives = collectives
        self.store = store
        self.rank, self.world_size = rank, world_size
        self.after_s, self.poll_s = after_s, poll_s
        self.host = socket.gethostname()
        self._stop = threading.Event()
        self._main = threading.main_thread()
        self.stopped_peers: dict[int, int] = {}
        """The ranks (→ pid) found stopped while this rank waited for them."""
        self._thread = threading.Thread(target=self._run, name="multigpu-watchdog", daemon=True)

    def start(self) -> None:
        """Start watching (after leaving this rank's host and pid in the store)."""
        self.store.set(f"{PREFIX}pid-{self.rank}", json.dumps([self.host, os.getpid()]))
        self._thread.start()

    def stop(self, wait_s: float = STOP_WAIT_S) -> bool:
        """Stop watching and wait (at most ``wait_s``) for the thread to end; True once it has.

        The wait matters at exit: a daemon thread still inside a store call when the interpreter
        finalizes is ended by ``pthread_exit`` as the call returns, whose unwinding through
        pybind11's GIL guard (noexcept) aborts the process ("terminate called without an active
        exception", SIGABRT) after a run that succeeded. Joined here, no thread of ours is in
        torch's code by then.
        """
        self._stop.set()
        if self._thread.ident is None or self._thread is threading.current_thread():
            return not self._thread.is_alive()  # never started, or asked from the thread itself
        self._thread.join(wait_s)
        if self._thread.is_alive():  # a store that stopped answering: nothing more to do here
            log.warning(
                "rank %d: the hang watchdog still waits for the store after %g s; exiting anyway",
                self.rank,
                wait_s,
            )
        return not self._thread.is_alive()

    def report(self) -> dict[str, Any]:
        """This rank's report: host, where the main thread is, and its collective log."""
        frame = sys._current_frames().get(self._main.ident or -1)
        stack = traceback.format_stack(frame)[-8:] if frame is not None else []
        return {
            "rank": self.rank,
            "host": self.host,
            "where": user_site(frame),
            "stack": "".join(stack),
            **self.collectives.snapshot(),
        }

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                if self._check():
                    return
            except Exception as e:  # the store is gone (peer died, shutdown): nothing to explain
                log.debug("watchdog stopped: %s", e)
                return

    def _check(self) -> bool:
        """One poll; True once this rank has reported."""
        flight = self.collectives.in_flight
        stalled = flight is not None and time.monotonic() - flight.started >= self.after_s
        if stalled:
            stopped = self._stopped_peers()
            if stopped:
                assert flight is not None
                self.stopped_peers.update(stopped)
                self.store.set(PREFIX + "alarm", STOPPED_ALARM)
                if self.store.add(PREFIX + "stopped-said", 1) == 1:  # one line for the run
                    waits_in = describe(asdict(flight))
                    self._print(stopped_line(stopped, self.host, self.rank, waits_in))
                return True
            self.store.set(PREFIX + "alarm", str(self.rank))
        elif not self.store.check([PREFIX + "alarm"]):
            return False
        elif self.store.get(PREFIX + "alarm") == STOPPED_ALARM.encode():
            return True  # said in one line: nothing of this rank would add to it
        mine = self.report()
        self.store.set(f"{PREFIX}rank-{self.rank}", json.dumps(mine))
        self._print(
            f"[rank {self.rank}] multigpu: hang report: at {mine['where']}\n" + mine["stack"]
        )
        if self.rank == 0:
            self._summarise()
        return True

    def held_up(self) -> bool:
        """True when a peer this rank waited for was found stopped and still is (not one that
        was resumed since: a later failure would then be a cause of its own)."""
        return any(is_stopped(pid) for pid in self.stopped_peers.values())

    def _stopped_peers(self) -> dict[int, int]:
        """The other ranks on this host that are stopped (SIGSTOP, Ctrl-Z): rank → pid."""
        found = {}
        for rank in range(self.world_size):
            key = f"{PREFIX}pid-{rank}"
            if rank == self.rank or not self.store.check([key]):
                continue
            host, pid = json.loads(self.store.get(key))
            if host == self.host and is_stopped(int(pid)):
                found[rank] = int(pid)
        return found

    def _summarise(self) -> None:
        deadline = time.monotonic() + COLLECT_S
        keys = {r: f"{PREFIX}rank-{r}" for r in range(self.world_size)}
        reports: dict[int, dict[str, Any]] = {}
        while time.monotonic() < deadline and len(reports) < self.world_size:
            for r, key in keys.items():
                if r not in reports and self.store.check([key]):
                    reports[r] = json.loads(self.store.get(key))
            time.sleep(0.1)
        self._print("\n".join(explain(reports, self.world_size, self.after_s)))

    def _print(self, text: str) -> None:
        # One write: every rank prints at once, and a line must not be split from its newline.
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
        sys.stderr.flush()


def stopped_line(stopped: dict[int, int], host: str, rank: int, waits_in: str) -> str:
    """The one line said when ranks ``stopped`` (rank → pid, on ``host``) hold up ``rank``.

    Example:
        >>> print(stopped_line({1: 4242}, "n0", 0, "all_reduce #5 at t.py:9 in f()"))
        multigpu: rank 1 (pid 4242 on n0) is stopped (SIGSTOP or Ctrl-Z): rank 0 waits for it in \
all_reduce #5 at t.py:9 in f(); resume it with `kill -CONT 4242`, or the collective timeout \
(--timeout) ends the run
    """
    ranks = ", ".join(str(r) for r in sorted(stopped))
    pids = " ".join(str(stopped[r]) for r in sorted(stopped))
    verb, it = ("is", "it") if len(stopped) == 1 else ("are", "them")
    return (
        f"multigpu: rank {ranks} (pid {pids.replace(' ', ', ')} on {host}) {verb} stopped "
        f"(SIGSTOP or Ctrl-Z): rank {rank} waits for {it} in {waits_in}; resume {it} with "
        f"`kill -CONT {pids}`, or the collective timeout (--timeout) ends the run"
    )


def start_watchdog(
    *, rank: int, world_size: int, timeout: timedelta, environ: Mapping[str, str]
) -> Watchdog | None:
    """Record collectives and start the watchdog, unless ``MULTIGPU_WATCHDOG=0`` or alone."""
    if world_size < 2 or not variables.watchdog(environ):
        return None
    try:
        store = default_store()
    except Exception as e:  # no store to meet in (an unusual init method): no explanations
        log.info("hang watchdog off: the process group has no store (%s)", e)
        return None
    from multigpu.instruments.hang.install import install

    # A crash in native code (gloo aborting on mismatched collectives) then still prints the
    # Python stack of every thread.
    if not faulthandler.is_enabled():
        faulthandler.enable()
    trace_dir = environ.get("MULTIGPU_TRACE_DIR")
    trace = os.path.join(trace_dir, f"rank-{rank}.trace") if trace_dir else None
    watchdog = Watchdog(
        install(trace),
        store,
        rank=rank,
        world_size=world_size,
        after_s=report_after(timeout.total_seconds(), environ),
    )
    watchdog.start()
    return watchdog

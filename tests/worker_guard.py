"""A test process that dies, hangs or leaves processes behind fails the run, naming the test.

Three ways a run went wrong without a clear failure before this plugin (pytest-xdist 3.8,
``--dist loadfile`` as ``./scripts/test`` runs it):

- **A test process died** (a native abort, ``terminate called without an active exception``;
  a segfault): xdist reported the test, then put its file back in the queue *with the crashed
  test still pending*, so a new worker ran it again, and again — 13 reports of one test until
  "maximum crashed workers reached: 12" stopped the whole run, every test not yet run dropped
  (a rare crash: reported, then the same test run again). Now the scheduler
  counts the crashed test as run: one failure, which says how the worker ended (the signal),
  carries the worker's own fatal-error report (faulthandler writes it to a file per worker,
  read here), and the file's remaining tests run on the replacement worker. The processes the
  dead worker had started (found by the ``PYTEST_PROCESS_OWNER`` variable they inherit; their
  parent is gone) are killed: left alone they went on training, holding ports and CPU.
- **A test hung where SIGALRM cannot reach it** (a C++ wait on a condition variable, a lock
  taken with the GIL held): pytest-timeout's signal fires only when the interpreter gets
  control back, so the run waited for CI's 90-minute limit. A native timer
  (``faulthandler.dump_traceback_later(exit=True)``, which needs no GIL) now ends the test
  process ``GRACE_S`` after the test's own timeout, with every thread's stack; under xdist that
  is the crash above, reported once with the stacks.
- **A test left processes running** (a launcher never waited for, a worker that outlived its
  agent): they ran on after the suite, and one holding the run's stderr (``-s``, or started
  outside capture) kept CI's pipe open after pytest ended. After each test file's last
  teardown, the processes started during the file by this test process (its descendants, and
  orphans carrying its ``PYTEST_PROCESS_OWNER``) that still run are killed by pid and reported
  as an error of that teardown, each named with the test during which it started. What lives
  for the whole test process by design (multiprocessing's fork server and resource tracker,
  inductor's compile workers) is left alone: it ends with the process.

Linux only (``/proc``); elsewhere the plugin does nothing beyond xdist's own behaviour.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

OWNER = "PYTEST_PROCESS_OWNER"
"""Set in every process that runs tests (``<run id>:<worker id>``); its children inherit it."""

GRACE_S = 60.0
"""Seconds past a test's pytest-timeout before the native timer ends its process: time for
pytest-timeout's own failure and the fixtures' teardown (killing launchers, waiting for them).
The ini option ``worker_guard_grace`` changes it (the harness's own tests use seconds)."""

SETTLE_S = 20.0
"""Seconds a file's leftover processes get to end by themselves before they count as leaked
(a launcher a test has just signalled may take a moment to exit); ini ``worker_guard_settle``."""

LIFETIME_HELPERS = (
    "from multiprocessing.forkserver import main",
    "from multiprocessing.resource_tracker import main",
    "torch._inductor.compile_worker",
    "_inductor/compile_worker",
)
"""Command-line marks of processes that serve the test process until it exits, by design."""

_ON_LINUX = sys.platform.startswith("linux") and Path("/proc/self/stat").exists()
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if _ON_LINUX else 0.01


# --- processes, from /proc ----------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    state: str
    started_s: float
    """Seconds after boot (CLOCK_BOOTTIME, the clock of /proc's start times)."""


def _now_s() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _processes() -> dict[int, Proc]:
    found: dict[int, Proc] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:  # ended meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()  # the command name may hold spaces and ')'
        found[int(name)] = Proc(int(name), int(fields[1]), fields[0], int(fields[19]) * _TICK_S)
    return found


def _environ_has(pid: int, entry: bytes) -> bool:
    try:
        return entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    """The command line on one line (a ``python -c`` program's newlines shown as ``\\n``)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "?"
    return " ".join(arg.replace("\n", "\\n") for arg in argv if arg)


def _owned(token: str, *, since_s: float | None = None, root: int | None = None) -> list[Proc]:
    """Running processes descended from ``root`` or carrying ``OWNER=token`` (started at or after
    ``since_s``), oldest first; not ``root`` itself, not zombies."""
    procs = _processes()
    children: dict[int, list[int]] = {}
    for proc in procs.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    mine: set[int] = set()
    stack = [root] if root is not None else []
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in mine:
                mine.add(child)
                stack.append(child)
    entry = f"{OWNER}={token}".encode()
    out = []
    for proc in procs.values():
        if proc.pid == root or proc.state in ("Z", "X"):
            continue
        if since_s is not None and proc.started_s < since_s:
            continue
        if proc.pid in mine or _environ_has(proc.pid, entry):
            out.append(proc)
    return sorted(out, key=lambda p: p.started_s)


def _kill(procs: list[Proc]) -> None:
    for proc in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc.pid, signal.SIGKILL)


def _alive(proc: Proc) -> bool:
    """Still the same process (a pid may be reused), and not a zombie."""
    try:
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] not in ("Z", "X") and abs(int(fields[19]) * _TICK_S - proc.started_s) < 1e-6


# --- in a process that runs tests ---------------------------------------------------------------


def _dump_path(testrunuid: str, workerid: str) -> Path:
    """Where worker ``workerid`` writes its fatal-error report (the controller reads it)."""
    return Path(tempfile.gettempdir()) / f"pytest-worker-{testrunuid}-{workerid}.txt"


class ProcessGuard:
    """The native timer and the leftover-process check of one process that runs tests."""

    def __init__(self, config: pytest.Config, token: str, dump: Any) -> None:
        self.config = config
        self.token = token
        self.dump = dump  # where the native timer writes the stacks (a file or a dup of stderr)
        self.file_began_s = 0.0
        self.began: list[tuple[float, str]] = []  # (seconds after boot, nodeid) of this file

    # The native timer rides on pytest-timeout's own hooks: armed and cancelled with its timer,
    # with its timeout (marker, option or ini); pytest's faulthandler plugin already cancels it
    # when pdb starts.
    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_timeout_set_timer(self, item: pytest.Item, settings: Any) -> None:
        grace = _seconds(self.config, "worker_guard_grace", GRACE_S)
        faulthandler.dump_traceback_later(settings.timeout + grace, exit=True, file=self.dump)

    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_timeout_cancel_timer(self, item: pytest.Item) -> None:
        faulthandler.cancel_dump_traceback_later()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> None:
        now = _now_s()
        if not self.began or self.began[-1][1].split("::", 1)[0] != _file_of(item):
            # /proc's start times are whole clock ticks (10 ms), rounded down: a process started
            # just after this moment may read as just before it.
            self.file_began_s, self.began = now - _TICK_S, []
        self.began.append((now, item.nodeid))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        if nextitem is not None and _file_of(nextitem) == _file_of(item):
            return (yield)  # the file's own (module-scoped) fixtures still live
        try:
            result = yield
        finally:
            left = self._leftovers()
            _kill([proc for proc, _ in left])
        if left:  # a teardown that failed by itself reports that instead
            lines = [
                f"  pid {p.pid}, started during {self._test_at(p.started_s)}: {text}"
                for p, text in left
            ]
            pytest.fail(
                f"{_file_of(item)} left {len(left)} process(es) running after its last test "
                f"(killed now); a test or fixture must end what it starts:\n" + "\n".join(lines),
                pytrace=False,
            )
        return result

    def _leftovers(self) -> list[tuple[Proc, str]]:
        """This file's processes still running after its last teardown, with command lines."""
        found = _owned(self.token, since_s=self.file_began_s, root=os.getpid())
        left = [p for p in found if not _is_helper(p)]
        deadline = time.monotonic() + _seconds(self.config, "worker_guard_settle", SETTLE_S)
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = [p for p in left if _alive(p)]
        return [(p, _short(_cmdline(p.pid))) for p in left]

    def _test_at(self, started_s: float) -> str:
        """The test of this file that was running when a process started: every test that was
        running during the clock tick in which it did (/proc counts whole ticks)."""
        if not self.began:
            return "?"
        first = max([0] + [i for i, (at, _) in enumerate(self.began) if at <= started_s])
        last = max([0] + [i for i, (at, _) in enumerate(self.began) if at < started_s + _TICK_S])
        return " or ".join(nodeid for _, nodeid in self.began[first : last + 1])


def _short(text: str) -> str:
    return text if len(text) <= 300 else text[:300] + " ..."


def _is_helper(proc: Proc) -> bool:
    text = _cmdline(proc.pid)
    return any(mark in text for mark in LIFETIME_HELPERS)


def _file_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


# --- in xdist's controller ----------------------------------------------------------------------


def _worker_exit(node: Any) -> str:
    """How a dead worker ended ('SIGABRT', 'exit code 1'), from execnet's Popen if it has one."""
    popen = getattr(getattr(getattr(node, "gateway", None), "_io", None), "popen", None)
    if popen is None:
        return "ended"
    code = None
    with contextlib.suppress(Exception):
        code = popen.wait(timeout=5)
    if code is None:
        return "stopped answering"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"died of {signal.Signals(-code).name}"
    return f"ended with exit code {code}"


class ControllerGuard:
    """Reports a dead worker once, with its own report, and ends what it left running."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.notes: dict[str, str] = {}  # worker id -> what to add to its crashed test's report

    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        dist = config.getvalue("dist")
        if dist not in ("loadfile", "loadscope"):
            return None
        from xdist.scheduler import LoadFileScheduling, LoadScopeScheduling

        base = LoadFileScheduling if dist == "loadfile" else LoadScopeScheduling
        return _no_rerun(base)(config, log)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        if error is None:
            return
        workerid = node.workerinput["workerid"]
        how = _worker_exit(node)
        dump = _dump_path(node.workerinput["testrunuid"], workerid)
        try:
            report = dump.read_text(errors="replace").strip()
        except OSError:
            report = ""
        with contextlib.suppress(OSError):
            dump.unlink()
        left = _owned(f"{node.workerinput['testrunuid']}:{workerid}") if _ON_LINUX else []
        cmdlines = [(p.pid, _cmdline(p.pid)) for p in left]
        _kill(left)
        parts = [f"worker {workerid!r} {how}."]
        if report.startswith("Timeout ("):
            parts.append(
                f"Its test ran {_seconds(self.config, 'worker_guard_grace', GRACE_S):g} s past its "
                "timeout: pytest-timeout's SIGALRM never "
                "got through (a native wait), so the native timer ended the worker. Stacks:"
            )
        if report:
            parts.append(_trim(report))
        if cmdlines:
            parts.append(
                f"Killed the {len(cmdlines)} process(es) it had left running:\n"
                + "\n".join(f"  pid {pid}: {_short(text)}" for pid, text in cmdlines)
            )
        self.notes[workerid] = "\n".join(parts)
        # A worker that died between tests names no test: say what is known right away.
        self.config.get_terminal_writer().line(f"\n{parts[0]}")

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: Any, sched: Any) -> None:
        workerid = report.node.gateway.id
        report.longrepr = (
            f"{report.longrepr}: the test process died (this test counts as failed, once; the "
            f"file's remaining tests run on a new worker)\n{self.notes.pop(workerid, '')}"
        )

    # A worker that died outside any test (its tests went to another worker) fails the run too:
    # xdist alone replaced it and said nothing more.
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for note in self.notes.values():
            terminalreporter.write_sep("=", "a test process died outside any test", red=True)
            terminalreporter.write_line(note)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.notes and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


_FRAMEWORK = tuple(
    f"/site-packages/{name}/"
    for name in ("_pytest", "pluggy", "xdist", "execnet", "pytest_timeout")
)


def _trim(report: str) -> str:
    """A faulthandler report without the frames of pytest's own machinery (30 of its ~40 lines
    for a test's thread), and without threads left with no other frame (execnet's reader)."""
    out: list[str] = []
    for line in report.splitlines():
        if line.startswith("  File ") and any(mark in line for mark in _FRAMEWORK):
            continue
        if out and out[-1].startswith("Thread 0x") and not line.startswith("  "):
            out.pop()  # a thread with only framework frames
        if line.startswith("Extension modules:"):
            continue
        out.append(line)
    while out and (not out[-1].strip() or out[-1].startswith("Thread 0x")):
        out.pop()
    return "\n".join(out)


def _no_rerun(base: type) -> type:
    """``base`` (xdist's file or scope scheduler) that counts a crashed test as run.

    xdist 3.8's ``remove_node`` puts the dead worker's whole work unit back in the queue with
    the crashed test still pending: a new worker ran it again (13 times for a test that always
    crashes, until xdist stopped the run). Here it is marked done before the rest goes back,
    at the front of the queue so that the file's remaining tests run next.
    """

    class NoRerun(base):  # type: ignore[misc,valid-type]
        def remove_node(self, node: Any) -> str | None:
            workload = self.assigned_work.pop(node)
            pending = [
                (scope, nodeid)
                for scope, unit in workload.items()
                for nodeid, done in unit.items()
                if not done
            ]
            if not pending:
                return None
            scope, crashitem = pending[0]  # the worker runs its tests in the order sent
            workload[scope][crashitem] = True
            for key, unit in workload.items():
                if not all(unit.values()):
                    self.workqueue[key] = unit
                    self.workqueue.move_to_end(key, last=False)
            for other in self.assigned_work:
                self._reschedule(other)
            return crashitem

        def _reschedule(self, node: Any) -> None:
            super()._reschedule(node)
            # A worker runs a test only once it holds the next one, or the end. Given one test
            # alone (a crashed file's remainder, on the new worker) it waited for either
            # forever, and the run with it: xdist 3.8 hands out one unit per completed test and
            # says the end only when a test completes with the queue empty (or at the first
            # schedule, which fills each worker to two tests).
            if node.shutting_down:
                return
            while self.workqueue and self._pending_of(self.assigned_work[node]) < 2:
                self._assign_work_unit(node)
            if not self.workqueue:
                node.shutdown()

    NoRerun.__name__ = NoRerun.__qualname__ = f"NoRerun{base.__name__}"
    return NoRerun


# --- wiring -------------------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "worker_guard_grace",
        f"seconds past a test's timeout before the native timer ends its process ({GRACE_S:g})",
        default=str(GRACE_S),
    )
    parser.addini(
        "worker_guard_settle",
        f"seconds a file's leftovers get to end before they count as leaked ({SETTLE_S:g})",
        default=str(SETTLE_S),
    )


def _seconds(config: pytest.Config, name: str, default: float) -> float:
    try:
        return float(config.getini(name))
    except (ValueError, TypeError):
        return default


_STDERR = pytest.StashKey[int]()


def pytest_configure(config: pytest.Config) -> None:
    # The terminal's stderr, taken where pytest's faulthandler plugin takes its own: by the
    # session's start, capture may have replaced it.
    if _ON_LINUX and not hasattr(config, "workerinput"):
        config.stash[_STDERR] = os.dup(sys.stderr.fileno())


# At the session's start: after every plugin's configure (xdist's makes the controller's session,
# pytest's faulthandler takes stderr), before the first test.
@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    if not _ON_LINUX:
        return
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None and config.pluginmanager.has_plugin("dsession"):
        config.pluginmanager.register(ControllerGuard(config), "multigpu-controller-guard")
        return
    if workerinput is not None:
        token = f"{workerinput['testrunuid']}:{workerinput['workerid']}"
        path = _dump_path(workerinput["testrunuid"], workerinput["workerid"])
        # Fatal errors (SIGABRT, SIGSEGV) and the native timer's stacks go to a file that the
        # controller adds to the crashed test's report: the worker's stderr reaches the
        # terminal unlabelled, mixed with the other workers'. Kept open until exit.
        dump: Any = path.open("w")
        faulthandler.enable(file=dump, all_threads=True)
        config.add_cleanup(lambda: _forget(path))
    else:
        token = f"{uuid.uuid4().hex}:main"
        # One process: the stacks go where pytest's own fatal-error reports go, the terminal.
        dump = os.fdopen(config.stash[_STDERR], "w")
    os.environ[OWNER] = token  # before the first test: the leak check sees it as unchanged
    config.pluginmanager.register(ProcessGuard(config, token, dump), "multigpu-test-guard")


def _forget(path: Path) -> None:
    """A worker that ends normally leaves no report file (its open handle stays valid)."""
    with contextlib.suppress(OSError):
        path.unlink()

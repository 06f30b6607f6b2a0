"""Seeded kill schedules for replica groups, and the driver that runs one and judges it.

Shared by the chaos test (``tests/replicas/test_chaos.py``: a short schedule, in CI) and the
chaos benchmark (``benchmarks/replica_chaos.py``: the full one). A schedule is drawn from a seed
(printed, so any run can be repeated): a loop shape of ``scripts/loops.py`` (README's
``for epoch in range``, a Checkpointer-bounded ``while ckpt.steps < N``, ``while loader.epoch <
E``), an LR schedule, a strategy inside the groups, and one to three kills, each of one of:

- ``worker``: a group's worker, by ``kill -9``, once its loader passed a step;
- ``save``: a group's worker while its Checkpointer writes (a temp directory is there);
- ``launcher``: a group's launcher (the group is gone for good, its workers with it);
- ``twice``: the same group's worker again, once its next life stepped;
- ``both``: two groups' workers at the same moment;
- ``after``: a group's worker, and once its next life healed and stepped, the other group's
  (every group then restarted mid-job: a loop bounded by its own counter cannot end right, and
  the run must end in one line).

A run is judged against the uninterrupted run of the same script (``--replicas 2``, no kill):
``exact`` (every group that finished is within ``TOLERANCE``, and one process wrote the outputs),
``ended`` (the run ended non-zero with one ``multigpu: error:`` line, nothing written as if it
were done), or ``OFF`` — a wrong result or a wrong number of writers after exit code 0, the one
outcome that must never happen.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tests.launch._util import popen_multigpu

LOOPS = Path(__file__).parent / "scripts" / "loops.py"
SHAPES = (("readme", "epoch"), ("readme", "step"), ("ckpt", "step"), ("while", "none"),
          ("while", "epoch"), ("ckpt", "none"))  # fmt: skip
KINDS = ("worker", "save", "launcher", "twice", "both", "after")
STEPS = 100  # loops.py: 4 epochs of 25 steps
TOLERANCE = 1e-5
PACE_S = "0.03"  # a step's sleep: restarts land mid-run


@dataclass(frozen=True)
class Kill:
    """One kill: ``kind`` of group ``group`` once its loader passed global step ``at``."""

    kind: str
    group: int
    at: int

    def __str__(self) -> str:
        return f"{self.kind}({self.group}@{self.at})"


@dataclass(frozen=True)
class Schedule:
    """What one chaos run does."""

    seed: int
    shape: str
    lr: str
    strategy: str
    kills: tuple[Kill, ...]

    def __str__(self) -> str:
        kills = " ".join(map(str, self.kills))
        return f"seed {self.seed}: {self.shape}/{self.lr}/{self.strategy}: {kills}"


def draw(seed: int) -> Schedule:
    """The schedule of ``seed``: every kind comes up (seed % 6 picks it), the rest at random."""
    rng = random.Random(seed)
    shape, lr = SHAPES[rng.randrange(len(SHAPES))]
    strategy = "fsdp" if rng.random() < 0.3 else "ddp"
    kind = KINDS[seed % len(KINDS)]
    if kind == "save" and shape != "ckpt":
        shape, lr = "ckpt", rng.choice(("step", "none"))
    group = rng.randrange(2)
    at = rng.randrange(5, STEPS - 5)
    kills: list[Kill] = []
    if kind == "save":
        at = 10 * rng.randrange(1, STEPS // 10 - 1)  # a step the Checkpointer saves at
    if kind == "twice":
        kills = [Kill("worker", group, at), Kill("worker", group, min(STEPS - 2, at + 15))]
    elif kind == "both":
        kills = [Kill("worker", 0, at), Kill("worker", 1, at)]
    elif kind == "after":
        at = min(at, STEPS // 2)  # room for the heal before the end
        kills = [Kill("worker", group, at), Kill("after", 1 - group, at)]
    else:
        kills = [Kill(kind, group, at)]
    if kind in ("worker", "launcher") and rng.random() < 0.4:  # then the other group, later
        kills.append(Kill("worker", 1 - group, min(STEPS - 2, at + rng.randrange(10, 40))))
    return Schedule(seed, shape, lr, strategy, tuple(kills))


@dataclass
class Outcome:
    """What a run did and the verdict."""

    schedule: Schedule
    code: int
    err: str
    verdict: str = ""
    worst: float | None = None
    """Largest relative difference of a group's parameters from the uninterrupted run."""
    pause_s: float | None = None
    """The longest gap between two steps of a group no kill touched."""
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)


def _position(path: Path) -> int:
    """The global step the last line of a group's steps file names (-1: none yet)."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return -1
    for line in reversed(lines):
        parts = line.split()
        if len(parts) == 2:
            return int(parts[1])
    return -1


def _lines(path: Path) -> int:
    try:
        return len(path.read_text().splitlines())
    except FileNotFoundError:
        return 0


def _lives(out: Path, group: int) -> list[Path]:
    return sorted(out.glob(f"pid-{group}-0-*"), key=lambda p: int(p.name.rsplit("-", 1)[1]))


def _launcher_of(top: int, group: int) -> int | None:
    """The pid of group ``group``'s launcher among ``top``'s children."""
    try:
        children = Path(f"/proc/{top}/task/{top}/children").read_text().split()
    except OSError:
        return None
    for pid in children:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"MULTIGPU_REPLICA_GROUP={group}".encode() in environ:
            return int(pid)
    return None


def _wait_for(check: Callable[[], bool], proc: Any, deadline: float) -> bool:
    while not check():
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def run(
    schedule: Schedule,
    out: Path,
    *,
    timeout_s: float = 300.0,
    nodes: int = 1,
    cpu: int = 1,
    **job_env: str,
) -> Outcome:
    """Run ``schedule`` in ``out`` and return what it did (not yet judged). ``nodes=2``: one
    group per test host (network namespaces, ``multigpu.testing.hosts``; root only), meeting at
    node0's lighthouse; ``cpu``: processes per group; ``job_env``: more of loops.py's variables
    (``JOB_PRECISION``, ``JOB_CLIP``, ``JOB_WAIT_*``)."""
    out.mkdir(parents=True, exist_ok=True)
    job = [str(LOOPS), str(out), schedule.shape, schedule.lr, schedule.strategy]
    env = {"JOB_SLEEP": PACE_S, **job_env}
    if nodes == 1:
        argv = ["run", "--replicas", "2", "--cpu", str(cpu), "--timeout", "60", *job]
        proc = popen_multigpu(argv, out, **env)
        return _drive(
            schedule, out, [proc], timeout_s, launchers=lambda g: _launcher_of(proc.pid, g)
        )
    from multigpu.testing.hosts import virtual_hosts
    from tests.multinode._util import host_env

    with virtual_hosts(2) as hosts:
        lighthouse = f"{hosts[0].name}:29510"
        procs = []
        for group, host in enumerate(hosts):
            argv = ["run", "--replicas", "2", "--replica-group", str(group), "--lighthouse",
                    lighthouse, "--iface", host.interface, "--cpu", str(cpu), "--timeout", "60",
                    *job]  # fmt: skip
            command = [sys.executable, "-m", "multigpu", *argv]
            # files, not pipes: nobody reads one node's while waiting for the other
            with (out / f"node{group}.err").open("w") as err:
                procs.append(host.run(command, host_env() | env, cwd=out, stdout=err, stderr=err))
        outcome = _drive(schedule, out, procs, timeout_s, launchers=lambda g: procs[g].pid)
        outcome.err = "\n".join((out / f"node{g}.err").read_text() for g in (0, 1))
        return outcome


def _drive(
    schedule: Schedule,
    out: Path,
    procs: list[subprocess.Popen[str]],
    timeout_s: float,
    *,
    launchers: Callable[[int], int | None],
) -> Outcome:
    """Make ``schedule``'s kills while ``procs`` (the launchers: one, or one per node) run."""
    started = time.monotonic()
    deadline = started + timeout_s
    notes: list[str] = []
    alive = _AnyAlive(procs)
    errs: list[str] = []
    lines_at_kill: dict[int, int] = {}
    try:
        for kill in schedule.kills:
            if kill.kind == "after":  # the other group's next life stepped: then this one
                other = out / f"steps-{1 - kill.group}-0"
                seen = lines_at_kill.get(1 - kill.group, 0)
                if not _wait_for(lambda other=other, seen=seen: _lines(other) > seen, alive,
                                 deadline):  # fmt: skip
                    notes.append(f"{kill}: the other group did not step again")
                    continue
            steps = out / f"steps-{kill.group}-0"
            # (a second kill of one group: its next life heals, then passes the step)
            if not _wait_for(
                lambda steps=steps, at=kill.at: _position(steps) >= at, alive, deadline
            ):
                notes.append(f"{kill}: not reached")
                continue
            if kill.kind == "launcher":
                pid = launchers(kill.group)
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                continue
            if kill.kind == "save":
                tmp = out / "ckpt" / f"group-{kill.group}"
                _wait_for(lambda tmp=tmp: any(tmp.glob(".tmp-*")), alive, time.monotonic() + 2.0)
            lives = _lives(out, kill.group)
            lines_at_kill[kill.group] = _lines(steps)
            if lives:
                try:
                    os.kill(int(lives[-1].read_text()), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    notes.append(f"{kill}: its worker was gone")
        for proc in procs:
            _, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            errs.append(err or "")  # None where the output went to a file
    except subprocess.TimeoutExpired:
        notes.append(f"ran over {timeout_s:.0f} s")
    finally:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.kill()
                _, err = proc.communicate()
                errs.append(err or "")
    codes = [proc.returncode for proc in procs]
    code = next((c for c in codes if c), 0)
    outcome = Outcome(schedule, code, "\n".join(errs), wall_s=time.monotonic() - started)
    outcome.notes = notes
    return outcome


class _AnyAlive:
    """``poll()`` like one process: None while any of ``procs`` runs."""

    def __init__(self, procs: list[subprocess.Popen[str]]) -> None:
        self.procs = procs

    def poll(self) -> int | None:
        return None if any(p.poll() is None for p in self.procs) else 0


def uninterrupted(
    shape: str, lr: str, strategy: str, out: Path, *, cpu: int = 1, **job_env: str
) -> dict[str, torch.Tensor]:
    """The parameters of the same run without any kill (``--replicas 2`` on one node)."""
    done = run(Schedule(-1, shape, lr, strategy, ()), out, cpu=cpu, **job_env)
    assert done.code == 0, done.err
    return torch.load(out / "params-0-0.pt")


def _pauses(out: Path, group: int) -> float:
    times = []
    for line in (out / f"steps-{group}-0").read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            times.append(float(parts[0]))
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def judge(outcome: Outcome, reference: dict[str, torch.Tensor], out: Path) -> Outcome:
    """Set ``outcome``'s verdict (see the module doc), worst difference and survivors' pause."""
    s = outcome.schedule
    lost = {k.group for k in s.kills if k.kind == "launcher"}
    touched = {k.group for k in s.kills}
    diffs = []
    for group in (0, 1):
        path = out / f"params-{group}-0.pt"
        if path.exists():
            got = torch.load(path)
            diffs.append(
                max(
                    ((got[k] - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item()
                    for k, ref in reference.items()
                )
            )
    outcome.worst = max(diffs) if diffs else None
    untouched = [g for g in (0, 1) if g not in touched]
    outcome.pause_s = max((_pauses(out, g) for g in untouched), default=None)
    writers = (out / "writers").read_text().split() if (out / "writers").exists() else []
    last = outcome.err.strip().splitlines()[-1:] or [""]
    close = outcome.worst is not None and outcome.worst <= TOLERANCE
    finished = {g for g in (0, 1) if (out / f"params-{g}-0.pt").exists()}
    # A group that came back after the job ended exits at once, saying so: it ends nothing.
    late = {
        g for g in (0, 1)
        if f"replica group {g}: the job already ended at step" in outcome.err
    }  # fmt: skip
    if outcome.code == 0 or (lost and outcome.code != 0 and finished >= {0, 1} - lost - late):
        ok = close and len(writers) == 1 and finished >= {0, 1} - lost - late
        outcome.verdict = "exact" if ok else "OFF"
        if not ok:
            outcome.notes.append(f"writers {writers}, finished {sorted(finished)}")
    elif last[0].startswith("multigpu: error: ") and not writers:
        outcome.verdict = "ended"
    else:
        outcome.verdict = "OFF"
        outcome.notes.append(f"exit {outcome.code}, last line {last[0][:200]!r}")
    return outcome

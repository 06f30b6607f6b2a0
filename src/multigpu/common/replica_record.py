"""The record of a replica-group job that outlives every group: its end, its lives, its counts.

``multigpu run --replicas R`` runs R groups, each restarted by its own agent; a group's process
knows only its own life. What the whole job needs to know lives in a small store that the
launcher which starts the lighthouse hosts beside it, on the same address (loopback on one node,
the cluster interface on several); its address reaches the workers as
``MULTIGPU_REPLICA_STORE``. Keys:

- ``end``: ``"STEP GROUP"``, written once (compare-and-set) by the first group whose loop ended
  cleanly: a group whose loop counter a restart reset stops its loaders at that step, and a group
  that comes back later exits at once (``multigpu.replicas.coordinator``).
- ``failed``: the one line of an error no restart can help (``errors.ReplicaError``), written
  once: every group, and every group that comes back, ends with it.
- ``exited/G``: group G's launcher ended (its exit code): none of its lives will come back.
- ``seen/G``: counts group G's looks at the record (one or two a step): while a group still
  looks, the launcher that hosts the record keeps it (a group on its last step learns the end).
- ``life/G``: ``"N STATE"``: group G's current life (its N-th process start) and whether its loop
  is ``aligned`` (it began where the script put it), ``healed`` (a heal put it later: its loop
  counter is behind the job's) or ``gone`` (it ended); a life killed keeps its last state until
  the next life writes. A group whose loop counter is behind waits, when no aligned group is in
  its quorum, for an aligned one that is alive but away (its last steps' post-loop work).
- ``count/G/NAME``: what happened to group G over all its lives (steps, heals, ...), added as it
  happens (a life killed keeps what it did); the launcher's summary at the end reads them, with
  ``lives/G``, the lives begun.

Both sides are here so that the keys are defined once: the launcher makes the store server
(``JobRecord.hosted``), the workers a client; the store is handed in (this module imports no
torch). Every call is bounded by the store's timeout; a store gone with its node raises.
"""

from __future__ import annotations

from typing import Any

COUNTS = ("steps", "short", "retried", "left", "joined", "healed")
"""A group's counters: committed steps, steps run short-handed, steps retried after a failure,
times other groups left / rejoined its quorum, times it healed."""


class JobRecord:
    """A worker's or the launcher's view of the job's record (``store``: a torch ``Store``, or
    None for a group started by hand, whose facts then stay its own)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._local: dict[str, str] = {}  # without a store: this process's own view

    # ---- keys ------------------------------------------------------------------------------------
    def _get(self, key: str) -> str | None:
        if self._store is None:
            return self._local.get(key)
        if not self._store.check([key]):
            return None
        return bytes(self._store.get(key)).decode()

    def _set(self, key: str, value: str) -> None:
        if self._store is None:
            self._local[key] = value
        else:
            self._store.set(key, value)

    def _first(self, key: str, value: str) -> str:
        """``value`` stored under ``key`` unless one was stored before; the stored one."""
        if self._store is None:
            return self._local.setdefault(key, value)
        return bytes(self._store.compare_set(key, "", value)).decode()

    # ---- the job's end and failure ---------------------------------------------------------------
    def end(self) -> tuple[int, int] | None:
        """``(step, group)`` where the job ended, or None while it runs."""
        found = self._get("end")
        if not found:
            return None
        step, group = found.split()
        return int(step), int(group)

    def announce_end(self, step: int, group: int) -> tuple[int, int]:
        """Group ``group`` ended its loop at ``step``; the job's end (the first announced)."""
        step_s, group_s = self._first("end", f"{step} {group}").split()
        return int(step_s), int(group_s)

    def failed(self) -> str | None:
        """The line of the error that ended the job, or None."""
        return self._get("failed") or None

    def announce_failure(self, line: str) -> str:
        """The job ends with ``line`` (unless another ended it first: that one is returned)."""
        return self._first("failed", line)

    def mark_exited(self, group: int, code: int) -> None:
        """``group``'s launcher ended with ``code``: no life of it comes back (its node's
        launcher says so)."""
        self._set(f"exited/{group}", str(code))

    def seen(self, group: int) -> int:
        """Count a look of ``group`` at the record; the count (see ``seen/G``)."""
        if self._store is None:
            count = int(self._local.get(f"seen/{group}", "0")) + 1
            self._local[f"seen/{group}"] = str(count)
            return count
        return int(self._store.add(f"seen/{group}", 1))

    def looks(self, groups: int) -> list[int]:
        """Every group's count of looks (``seen/G``), without counting one."""
        return [int(self._get(f"seen/{g}") or 0) for g in range(groups)]

    def exited(self, group: int) -> bool:
        """Whether ``group``'s launcher ended."""
        return self._get(f"exited/{group}") is not None

    # ---- lives -----------------------------------------------------------------------------------
    def start_life(self, group: int) -> int:
        """A new life of ``group`` begins, aligned; its number (1 for the first)."""
        if self._store is None:
            life = int(self._local.get(f"lives/{group}", "0")) + 1
            self._local[f"lives/{group}"] = str(life)
        else:
            life = int(self._store.add(f"lives/{group}", 1))
        self.set_life(group, life, "aligned")
        return life

    def set_life(self, group: int, life: int, state: str) -> None:
        """Life ``life`` of ``group`` is now ``state`` (``aligned``, ``healed`` or ``gone``)."""
        self._set(f"life/{group}", f"{life} {state}")

    def life(self, group: int) -> tuple[int, str] | None:
        """``(life, state)`` of ``group``'s last life, or None before its first."""
        found = self._get(f"life/{group}")
        if not found:
            return None
        number, state = found.split()
        return int(number), state

    # ---- counts ----------------------------------------------------------------------------------
    def add_counts(self, group: int, counts: dict[str, int]) -> None:
        """Add ``counts`` (names of ``COUNTS``) to group ``group``'s."""
        for name, value in counts.items():
            if not value:
                continue
            if self._store is None:
                key = f"count/{group}/{name}"
                self._local[key] = str(int(self._local.get(key, "0")) + value)
            else:
                self._store.add(f"count/{group}/{name}", int(value))

    def counts(self, group: int) -> dict[str, int]:
        """Group ``group``'s counts over all its lives so far."""
        found = {name: int(self._get(f"count/{group}/{name}") or 0) for name in COUNTS}
        found["lives"] = int(self._get(f"lives/{group}") or 0)
        return found


def job_summary(record: JobRecord, groups: int) -> str:
    """The launcher's last line: where the job ended and what happened to each group (its
    lives, the steps it committed over them, how many it ran short-handed, retried, healed).

    Example:
        >>> r = JobRecord(None)
        >>> r.add_counts(0, {"steps": 200, "short": 16})
        >>> r.add_counts(1, {"steps": 153, "healed": 1})
        >>> _ = r.start_life(0), r.start_life(1), r.start_life(1), r.announce_end(200, 0)
        >>> print(job_summary(r, 2).replace("; g", ";\\ng"))
        replica groups: the job ended at step 200;
        group 0: 1 life, 200 steps, 16 short-handed;
        group 1: 2 lives, 153 steps, healed 1 time(s)
    """
    end = record.end()
    head = f"the job ended at step {end[0]}" if end is not None else "the job did not end"
    parts = []
    for group in range(groups):
        c = record.counts(group)
        said = [f"{c['lives']} li{'ves' if c['lives'] != 1 else 'fe'}", f"{c['steps']} steps"]
        if c["short"]:
            said.append(f"{c['short']} short-handed")
        if c["retried"]:
            said.append(f"{c['retried']} retried")
        if c["healed"]:
            said.append(f"healed {c['healed']} time(s)")
        parts.append(f"group {group}: " + ", ".join(said))
    return f"replica groups: {head}; " + "; ".join(parts)

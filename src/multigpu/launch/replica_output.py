"""The replica groups' stderr, merged into the launcher's: whole lines, and one ending.

Each group is a launcher of its own (``multigpu.launch.replica_groups``), which ends a failed run
with its one line (``multigpu: error: ...``). When every group refuses the same input (a batch the
groups cannot share, a strategy they cannot replicate) or ends with the same ``ReplicaError``,
R identical lines would follow each other; here each group's stderr is read line by line and
passed on whole (lines of different groups never mix; multigpu's own lines get the group's
name), its ending lines held back, and at the end each distinct ending is said once, naming the
groups that ended with it.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from typing import IO

ENDINGS = ("multigpu: error: ", "multigpu: stopped by ")
"""How a group's launcher begins its last line (a failure, or a signal that stopped it)."""
OURS, NAMED = "multigpu: ", "multigpu: replica group "
"""multigpu's own lines, and those that already name their group (the others get its name)."""


class GroupOutput:
    """Reads the groups' stderr pipes; ``endings()`` once they closed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, list[int]] = {}  # an ending line -> the groups that said it
        self._threads: list[threading.Thread] = []

    def follow(self, group: int, stream: IO[bytes]) -> None:
        """Pass ``group``'s lines on as they come (a thread of its own)."""
        thread = threading.Thread(
            target=self._forward, args=(group, stream), name=f"group-{group}-stderr", daemon=True
        )
        thread.start()
        self._threads.append(thread)

    def _forward(self, group: int, stream: IO[bytes]) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace")
            if line.startswith(ENDINGS):
                with self._lock:
                    self._held.setdefault(line.rstrip("\n"), []).append(group)
                continue
            if line.startswith(OURS) and not line.startswith(NAMED):
                # the group's launcher (a restart, a rendezvous round): which group's
                line = f"{NAMED}{group}: {line[len(OURS) :]}"
            with self._lock:
                sys.stderr.write(line if line.endswith("\n") else line + "\n")
                sys.stderr.flush()
        stream.close()

    def endings(self, timeout_s: float = 5.0) -> list[tuple[str, list[int]]]:
        """Each distinct ending line and the groups that said it, in the order first said
        (after the pipes closed, or ``timeout_s``: a worker that outlived its launcher may keep
        one open)."""
        for thread in self._threads:
            thread.join(timeout=timeout_s)
        with self._lock:
            return [(line, sorted(groups)) for line, groups in self._held.items()]


def ending_line(line: str, groups: Sequence[int], all_groups: int) -> str:
    """An ending said once for ``groups``: the group(s) named after the prefix, unless every
    group of the job said it.

    Example:
        >>> ending_line("multigpu: error: rank 0 on h: UsageError: no", [0, 1], 3)
        'multigpu: error: replica groups 0, 1: rank 0 on h: UsageError: no'
        >>> ending_line("multigpu: error: rank 0 on h: UsageError: no", [0, 1, 2], 3)
        'multigpu: error: rank 0 on h: UsageError: no'
    """
    if len(groups) == all_groups:
        return line
    prefix = next(p for p in ENDINGS if line.startswith(p))
    names = ", ".join(str(g) for g in groups)
    label = f"replica group{'s' if len(groups) > 1 else ''} {names}"
    return f"{prefix}{label}: {line[len(prefix) :]}"

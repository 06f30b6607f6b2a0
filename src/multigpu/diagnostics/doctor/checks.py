"""The rows of ``multigpu doctor``: ``Check`` (one finding), its statuses, counts, exit code.

- ``OK``: looked at it, it is fine;
- ``WARN``: it works, but it will be slow or break in some setups (the fix says what to do);
- ``FAIL``: distributed training will not work as things are (the fix says what to do);
- ``SKIP``: not applicable here (no GPU, a CPU-only torch, ``--no-probe``): the value says why.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["OK", "WARN", "FAIL", "SKIP"]
STATUSES: tuple[Status, ...] = ("OK", "WARN", "FAIL", "SKIP")
"""Every status, in the order the summary counts them."""


def one_line(text: object) -> str:
    """``text`` as one line: whitespace runs (newlines included) become one space."""
    return " ".join(str(text).split())


@dataclass(frozen=True, kw_only=True)
class Check:
    """One row of the doctor's table. Build it with ``ok``, ``warn``, ``fail`` or ``skip``."""

    group: str
    """What it is about: ``software``, ``cuda``, ``gpu``, ``cpu``, ``network``, ``launch``,
    ``process group`` or ``ranks``."""
    name: str
    """The thing checked, e.g. ``torch``, ``/dev/shm``, ``eth0``."""
    status: Status
    value: str
    """What was found, on one line (for SKIP: why it does not apply)."""
    fix: str = ""
    """For WARN and FAIL: what to do about it, one concrete line; empty for OK and SKIP."""
    where: str = ""
    """The rank and host the row comes from when it is another rank's (``rank 1 (node1)``)."""
    detail: Mapping[str, Any] = field(default_factory=dict)
    """More for the JSON document (a topology matrix, bandwidth per size); not in the table."""

    def __post_init__(self) -> None:
        # Built by our own code only: these guard the table's promise, not user input.
        if self.status not in STATUSES:
            raise ValueError(f"Check status {self.status!r}; expected one of {STATUSES}")
        if self.status in ("WARN", "FAIL") and not self.fix:
            raise ValueError(f"Check {self.name!r} is {self.status} without a fix")
        if not self.value:
            raise ValueError(f"Check {self.name!r} has no value (for SKIP: the reason)")

    def as_dict(self) -> dict[str, Any]:
        """The row as the JSON document holds it."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Check:
        """The row back from ``as_dict`` (another rank's rows arrive this way)."""
        return cls(
            group=str(data["group"]),
            name=str(data["name"]),
            status=data["status"],
            value=str(data["value"]),
            fix=str(data.get("fix", "")),
            where=str(data.get("where", "")),
            detail=dict(data.get("detail") or {}),
        )


def _make(
    status: Status, group: str, name: str, value: object, fix: object = "", **detail: Any
) -> Check:
    return Check(
        group=group,
        name=name,
        status=status,
        value=one_line(value),
        fix=one_line(fix),
        detail=detail,
    )


def ok(group: str, name: str, value: object, **detail: Any) -> Check:
    """An OK row."""
    return _make("OK", group, name, value, **detail)


def warn(group: str, name: str, value: object, fix: object, **detail: Any) -> Check:
    """A WARN row: it works but will be slow or fragile; ``fix`` says what to do."""
    return _make("WARN", group, name, value, fix, **detail)


def fail(group: str, name: str, value: object, fix: object, **detail: Any) -> Check:
    """A FAIL row: distributed training will not work like this; ``fix`` says what to do."""
    return _make("FAIL", group, name, value, fix, **detail)


def skip(group: str, name: str, reason: object, **detail: Any) -> Check:
    """A SKIP row: the check does not apply here; ``reason`` says why."""
    return _make("SKIP", group, name, reason, **detail)


def summary(checks: Iterable[Check]) -> dict[str, int]:
    """How many rows have each status (every status present, 0 when none).

    Example:
        >>> summary([ok("a", "b", "c"), skip("a", "d", "e")])
        {'OK': 1, 'WARN': 0, 'FAIL': 0, 'SKIP': 1}
    """
    counts: dict[str, int] = dict.fromkeys(STATUSES, 0)
    for check in checks:
        counts[check.status] += 1
    return counts


def exit_code(checks: Iterable[Check]) -> int:
    """1 when any row FAILs, else 0 (WARN and SKIP do not fail the command)."""
    return 1 if any(check.status == "FAIL" for check in checks) else 0

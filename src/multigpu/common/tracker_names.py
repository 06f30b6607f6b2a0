"""The experiment trackers a run can log to, and the one check of a ``log_to`` value.

No torch and no tracker package is imported here: the launcher checks ``MULTIGPU_LOG_TO`` and
``multigpu train --log-to`` with it before any worker starts, and ``multigpu.init(log_to=)``
before anything starts; a tracker's package is only looked up (``importlib.util.find_spec``).
The trackers themselves are in ``multigpu.instruments.tracking``.
"""

from __future__ import annotations

import difflib
import importlib.util
from collections.abc import Sequence
from types import MappingProxyType

from multigpu.errors import UsageError

TRACKERS = MappingProxyType(
    {"tensorboard": "tensorboard", "csv": None, "mlflow": "mlflow", "wandb": "wandb", "ray": "ray"}
)
"""Each tracker's name and the package it needs (None: nothing beyond multigpu). ``ray`` reports
through ``ray.train.report``, in a Ray Train worker only."""

EXTRA = "pip install 'multigpu[track]'"
"""The install command of the optional extra that brings every tracker's package but Ray's."""
OWN_EXTRA = MappingProxyType({"ray": "pip install 'multigpu[ray]'"})
"""The trackers whose package comes with an extra of its own."""


def parse_trackers(value: str | Sequence[str] | None, given_as: str) -> tuple[str, ...]:
    """The tracker names of ``value`` (``"tensorboard,csv"`` or a sequence), in order, once each.

    ``given_as`` says where the value came from, for the message (``--log-to``,
    ``MULTIGPU_LOG_TO=``, ``log_to=``). ``None``, ``""`` and ``"none"`` mean no tracker.

    Raises:
        UsageError: an unknown name (with the nearest known one), or a tracker whose package
            is not installed (naming the extra that installs it).

    Example:
        >>> parse_trackers("CSV, csv", "--log-to")
        ('csv',)
        >>> try:
        ...     parse_trackers("tensorbord", "--log-to")
        ... except UsageError as e:
        ...     print(str(e).split(";")[0])
        --log-to 'tensorbord': unknown tracker 'tensorbord' (did you mean tensorboard?)
    """
    if value is None:
        return ()
    parts = value.split(",") if isinstance(value, str) else list(value)
    names: list[str] = []
    for part in parts:
        if not isinstance(part, str):
            raise UsageError(
                f"{_said(given_as, repr(value))}: {part!r} is not a tracker name; expected "
                f"names such as {', '.join(TRACKERS)}"
            )
        name = part.strip().lower()
        if name in ("", "none") or name in names:
            continue
        if name not in TRACKERS:
            near = difflib.get_close_matches(name, TRACKERS, n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            shown = value if isinstance(value, str) else ",".join(map(str, value))
            raise UsageError(
                f"{_said(given_as, repr(shown))}: unknown tracker {name!r}{hint}; expected a "
                f"comma-separated list of {', '.join(TRACKERS)}"
            )
        names.append(name)
    for name in names:
        check_installed(name, given_as)
    return tuple(names)


def check_installed(name: str, given_as: str) -> None:
    """Refuse tracker ``name`` when its package is not installed (one line naming the extra)."""
    package = TRACKERS[name]
    if package is not None and importlib.util.find_spec(package) is None:
        raise UsageError(
            f"{_said(given_as, name)}: the {name} tracker needs the {package} package, which "
            f"is not installed; run: {OWN_EXTRA.get(name, EXTRA)} (or pip install {package}), "
            f"or leave {name} out"
        )


def _said(given_as: str, value: str) -> str:
    """``--log-to csv``, ``log_to='csv'``, ``MULTIGPU_LOG_TO=csv``: how the user gave it."""
    return f"{given_as}{value}" if given_as.endswith("=") or not given_as else f"{given_as} {value}"

"""What the commands that generate a file (``multigpu slurm``, ``k8s``, ``sky``) do with it:
print it, or write it to ``--out`` whole or not at all."""

from __future__ import annotations

import sys
from pathlib import Path

from multigpu.common.atomic_file import atomic_write
from multigpu.errors import UsageError


def print_or_write(
    text: str, out: str | None, *, force: bool, option: str = "--out"
) -> Path | None:
    """Print ``text`` when ``out`` is None (and return None); else write it to ``out``
    atomically and return the path.

    Raises:
        UsageError: ``out`` exists (without ``force``), or its directory does not; nothing is
            written then.
    """
    if out is None:
        sys.stdout.write(text)
        return None
    path = Path(out)
    if path.exists() and not force:
        raise UsageError(f"{path} exists; expected a new path; pass --force to overwrite it")
    if not path.parent.is_dir():
        raise UsageError(
            f"{option} {path}: the directory {path.parent} does not exist; expected a file in "
            "an existing directory; create it first"
        )
    atomic_write(path, lambda fh: fh.write(text.encode()))
    return path

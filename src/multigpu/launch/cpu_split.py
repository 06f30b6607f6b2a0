"""The fastest CPU split measured here: saved by ``multigpu bench scaling``, read by ``--cpu auto``.

One small JSON file, ``cpu_split.json``, in ``$MULTIGPU_CACHE_DIR``, else
``$XDG_CACHE_HOME/multigpu``, else ``~/.cache/multigpu``. Each entry is one measurement for a
(host, cores, torch version, script) — the things that decide which split wins — with the
fastest split and every split's samples per second. A later measurement of the same key
replaces the earlier one.

``multigpu run --cpu auto`` / ``multigpu train --cpu auto`` take the entry for this host, core
count, torch and script; failing that, the newest entry for this host, cores and torch (another
script); failing that, ``DEFAULT_SPLIT_WHY``: one process using every core, and a note saying
how to measure. Nothing here imports torch or the training side: the launcher reads it.

Environment variables read: ``MULTIGPU_CACHE_DIR``, ``XDG_CACHE_HOME``, ``HOME`` (through
``Path.home``).
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from multigpu.common import variables
from multigpu.common.atomic_file import atomic_write

log = logging.getLogger(__name__)

CACHE_FILE = "cpu_split.json"
FORMAT = 1
"""The file's ``format``; a file of another format is ignored (and replaced on the next save)."""

DEFAULT_SPLIT_WHY = (
    "the default: on 2 idle cores (torch 2.13) `multigpu bench scaling` measured the digits "
    "job at 1.5x the samples/s of 2 processes x 1 thread, 21067 vs 13827"
)


def torch_version() -> str:
    """The installed torch's version, read without importing torch (``"2.13.0+cpu"``)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True, kw_only=True)
class SplitRecord:
    """One measurement: the fastest split of ``cores`` for ``script`` on ``host``."""

    host: str = field(default_factory=socket.gethostname)
    """The machine's hostname (default: this one's)."""
    cores: int
    """Cores the launcher could use (its CPU affinity)."""
    torch: str = field(default_factory=torch_version)
    """``torch.__version__`` of the environment measured (default: this one's)."""
    script: str
    """The script's absolute path, or the module name of ``-m`` (``script_key``)."""
    processes: int
    """The recommended number of processes..."""
    threads: int
    """... and OMP threads per process."""
    samples_per_second: float
    """Its throughput."""
    measured: Mapping[str, float | None] = field(default_factory=dict)
    """Every split measured: ``"PxT"`` → samples/s (None: the run failed)."""
    when: str = field(default_factory=lambda: time.strftime("%Y-%m-%d %H:%M"))
    """When it was measured (local time, ``YYYY-MM-DD HH:MM``; default: now)."""


def cache_path(environ: Mapping[str, str] | None = None) -> Path:
    """Where the recommendations live (see the module doc)."""
    return variables.cache_dir(environ) / CACHE_FILE


def script_key(script: str, *, is_module: bool) -> str:
    """How a script is named in the cache: a module as given, a file by its absolute path."""
    return script if is_module else os.path.realpath(script)


def load_records(path: Path) -> list[SplitRecord]:
    """The entries of the cache file; none when it is missing, unreadable or of another format."""
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            return []
        # Every field must be there: the defaults describe a measurement made here and now.
        needed = {f.name for f in fields(SplitRecord)}
        if any(needed - entry.keys() for entry in data["entries"]):
            raise KeyError("an entry lacks a field")
        return [SplitRecord(**entry) for entry in data["entries"]]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        log.warning(
            "ignoring the CPU split cache %s (%s); it is rewritten by the next "
            "`multigpu bench scaling`",
            path,
            e,
        )
        return []


def save_record(record: SplitRecord, environ: Mapping[str, str] | None = None) -> Path:
    """Add ``record`` to the cache (replacing the same host/cores/torch/script); return the file."""
    path = cache_path(environ)
    key = (record.host, record.cores, record.torch, record.script)
    kept = [r for r in load_records(path) if (r.host, r.cores, r.torch, r.script) != key]
    document = {"format": FORMAT, "entries": [asdict(r) for r in [*kept, record]]}
    return atomic_write(path, lambda fh: fh.write(json.dumps(document, indent=2).encode()))


def find_record(
    script: str, cores: int, environ: Mapping[str, str] | None = None
) -> tuple[SplitRecord, bool] | None:
    """(the entry to use, whether it was measured for ``script`` itself) or None."""
    host, version = socket.gethostname(), torch_version()
    here = [
        r
        for r in load_records(cache_path(environ))
        if (r.host, r.cores, r.torch) == (host, cores, version)
    ]
    for record in reversed(here):
        if record.script == script:
            return record, True
    return (here[-1], False) if here else None


def cpu_auto_split(
    script: str, *, is_module: bool, cores: int, environ: Mapping[str, str] | None = None
) -> tuple[int, str]:
    """``--cpu auto``: (processes, one line saying why) for ``script`` on this machine.

    Threads follow from the processes (the launcher gives each ``cores // processes``).
    """
    found = find_record(script_key(script, is_module=is_module), cores, environ)
    if found is None:
        return 1, (
            f"--cpu auto: no measured split for this machine ({cores} cores, torch "
            f"{torch_version()}): 1 process x {cores} threads ({DEFAULT_SPLIT_WHY}); run "
            "`multigpu bench scaling` (with your script) to measure and save the fastest split"
        )
    record, exact = found
    measured = ", ".join(
        f"{k} {v:.0f}" if v is not None else f"{k} failed" for k, v in record.measured.items()
    )
    what = "this script" if exact else f"{record.script} (not this script)"
    return record.processes, (
        f"--cpu auto: {record.processes} process(es) x {cores // record.processes} thread(s), "
        f"the fastest split `multigpu bench scaling` measured for {what} on this machine on "
        f"{record.when} (samples/s: {measured})"
    )

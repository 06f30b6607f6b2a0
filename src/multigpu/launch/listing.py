"""``multigpu gpus``: list this machine's GPUs as a table or as JSON.

Environment variables read: those ``multigpu.gpus.list_gpus`` reads (``CUDA_VISIBLE_DEVICES``).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any, TextIO

NO_GPU = "no GPU found; CPU processes are available with --cpu N"


def _as_dict(gpu: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(gpu) and not isinstance(gpu, type):
        return dataclasses.asdict(gpu)
    return dict(vars(gpu))


def show_gpus(
    *, as_json: bool = False, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Print the GPUs (``format_gpu_table`` or a JSON list); return the exit code (0).

    Example:
        >>> show_gpus(as_json=True)  # doctest: +SKIP
        []
        0
    """
    from multigpu.gpus import format_gpu_table, list_gpus

    stdout = sys.stdout if out is None else out
    stderr = sys.stderr if err is None else err
    gpus = list_gpus()
    if as_json:
        stdout.write(json.dumps([_as_dict(g) for g in gpus], indent=2, default=str) + "\n")
        if not gpus:
            stderr.write(NO_GPU + "\n")  # stdout stays valid JSON
    elif gpus:
        stdout.write(format_gpu_table(gpus).rstrip("\n") + "\n")
    else:
        stdout.write(NO_GPU + "\n")
    return 0

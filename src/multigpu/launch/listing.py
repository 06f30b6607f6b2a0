"""``multigpu gpus``: list this machine's GPUs as a table or as JSON.

Environment variables read: those ``multigpu.gpus.list_gpus`` reads (``CUDA_VISIBLE_DEVICES``).
"""

from __future__ import annotations

import dataclasses
import json
import sys

NO_GPU = "no GPU found; CPU processes are available with --cpu N"


def show_gpus(*, as_json: bool = False) -> int:
    """Print the GPUs (``format_gpu_table`` or a JSON list); return the exit code (0)."""
    from multigpu.gpus import format_gpu_table, list_gpus

    gpus = list_gpus()
    if as_json:
        print(json.dumps([dataclasses.asdict(g) for g in gpus], indent=2, default=str))
        if not gpus:
            print(NO_GPU, file=sys.stderr)  # stdout stays valid JSON
    else:
        print(format_gpu_table(gpus).rstrip("\n") if gpus else NO_GPU)
    return 0

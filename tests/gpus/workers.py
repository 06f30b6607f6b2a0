"""Module-level functions run in spawned processes by test_lock.py."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from multigpu.errors import UsageError
from multigpu.gpus import GPUInfo, claim_gpus, parse_gpu_request


def claim_and_hold(
    lock_dir: str, gpus: list[GPUInfo], text: str, start: Any, results: Any, done: str
) -> None:
    """Wait for ``start``, claim, report ``(kind, value)``, hold the claim until file ``done``.

    ``done`` is a file, not an Event: a process SIGKILLed inside ``Event.wait`` leaves the
    Event's condition waiting for it forever, which would hang ``done.set()`` in the test.
    """
    start.wait(60)
    try:
        claim = claim_gpus(parse_gpu_request(text), {}, lock_dir=lock_dir, gpus=gpus)
    except UsageError as e:
        results.put(("usage", str(e)))
        return
    results.put(("ok", claim.cuda_visible_devices))
    deadline = time.monotonic() + 60
    while not Path(done).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    claim.release()

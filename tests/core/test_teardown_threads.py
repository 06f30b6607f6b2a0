"""The end of a ``with multigpu.init()`` block leaves no thread in torch's code.

A thread of gloo or of multigpu alive at interpreter finalization can abort a finished worker:
gloo's workers and our watchdog end by ``pthread_exit`` when they reach for the GIL, and the
unwinding through a noexcept C++ frame is ``terminate called without an active exception``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from multigpu.testing import run_distributed
from tests.core import teardown_workers


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_teardown_ends_gloo_and_watchdog_threads_while_the_script_holds_its_objects(
    tmp_path: Path, strategy: str
) -> None:
    results = run_distributed(
        teardown_workers.finished_job, world_size=2, args=(str(tmp_path), strategy)
    )
    for out in results:
        assert out["held"]
        assert len(out["during"]) >= 4  # two groups (training, background saves), alive
        assert out["after"] == []  # before the fix: both groups' threads, until finalization
        assert out["python_threads"] == ["MainThread"]

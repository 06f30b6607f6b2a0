"""DDP on CPU processes keeps glibc's freed memory for the next step (runtime/allocator.py).

One real 2-process gloo run: while the Context lives, a 20 MiB block comes from the heap (the
mmap threshold raised to 32 MiB) and training steps as before; after its teardown glibc's
initial thresholds are back (the block gets a mapping of its own). A user who set an allocator
variable keeps glibc as they set it.
"""

from __future__ import annotations

import platform
from typing import Any

import pytest
import torch

from multigpu.runtime import allocator
from multigpu.testing import run_distributed
from tests.strategies.allocator_workers import ddp_step_then_teardown

pytestmark = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="glibc's allocator settings"
)


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    return list(run_distributed(ddp_step_then_teardown, world_size=2))


def test_ddp_keeps_freed_memory_while_the_context_lives(ranks: list[dict[str, Any]]) -> None:
    for result in ranks:
        assert result["kept"] is True
        assert result["mapped_during"] is False  # 20 MiB from the heap: threshold 32 MiB
    assert torch.equal(ranks[0]["weight"], ranks[1]["weight"])  # DDP still trains in step


def test_teardown_puts_glibc_thresholds_back(ranks: list[dict[str, Any]]) -> None:
    assert [r["mapped_after"] for r in ranks] == [True, True]


def test_a_user_allocator_setting_is_left_alone() -> None:
    ranks = run_distributed(
        ddp_step_then_teardown, world_size=2, env={"MALLOC_TRIM_THRESHOLD_": "131072"}
    )
    assert [r["kept"] for r in ranks] == [False, False]


def test_restore_without_keep_does_nothing() -> None:
    allocator.restore()  # counted: an unmatched restore must not go below zero
    assert allocator._held == 0  # the module's counter

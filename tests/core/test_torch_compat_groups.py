"""Canary of ``torch_compat.set_group_timeout`` / ``group_timeout`` (``_set_pg_timeout``, the gloo
backend's ``options._timeout``: private), and of what ``multigpu.init`` does with them: a group
made before it (as Ray Train makes one, with 1800 s) is adopted with multigpu's timeout, so a
collective a rank never joins fails after that timeout, not half an hour later."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from multigpu import torch_compat
from multigpu.testing import run_distributed


def test_a_groups_timeout_is_read_and_changed_after_it_was_made() -> None:
    dist.init_process_group(
        "gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=1800)
    )
    try:
        assert torch_compat.group_timeout() == timedelta(seconds=1800)
        torch_compat.set_group_timeout(timedelta(seconds=7))
        assert torch_compat.group_timeout() == timedelta(seconds=7)
    finally:
        dist.destroy_process_group()
    assert torch_compat.group_timeout() is None  # no group


def adopted_group_times_out() -> dict[str, Any]:
    """A group made first with Ray's 1800 s; multigpu.init(timeout=3) adopts it. Rank 0 then
    all-reduces alone: it must fail after about 3 s."""
    import multigpu

    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=1800))
    found: dict[str, Any] = {}
    with multigpu.init(timeout=3, seed=None):
        found["timeout"] = torch_compat.group_timeout()
        if dist.get_rank() == 1:
            time.sleep(12)  # never joins: rank 0's all-reduce waits for it
        else:
            began = time.monotonic()
            try:
                dist.all_reduce(torch.ones(1))
            except RuntimeError as e:
                found["failed_after"], found["error"] = time.monotonic() - began, str(e)[:200]
    dist.destroy_process_group()  # the script's own group: the Context adopted it, not owned it
    return found


def test_multigpu_init_gives_an_adopted_group_its_own_timeout() -> None:
    r0, r1 = run_distributed(
        adopted_group_times_out, world_size=2, env={"MULTIGPU_WATCHDOG": "0"}, timeout=90
    )
    assert r0["timeout"] == r1["timeout"] == timedelta(seconds=3)
    assert 2.5 <= r0["failed_after"] < 10, r0

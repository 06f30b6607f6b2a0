"""The end of a ``with multigpu.init()`` block runs no collective: a peer that does not come
cannot hold a finished rank longer than the context's timeout, nor fail it."""

from __future__ import annotations

import pytest

from multigpu.testing import run_distributed
from tests.hang import exit_workers


@pytest.mark.parametrize("by_error", [True, False], ids=["peer-left-by-error", "peer-late"])
def test_a_rank_that_ends_normally_is_neither_failed_nor_held_by_a_peer(by_error: bool) -> None:
    # Before: rank 0's straggler report was an all-gather at exit, which rank 1 did not join in
    # time: rank 0 failed at exit (a closed connection, gloo's timeout) after a run that succeeded.
    rank0, rank1 = run_distributed(
        exit_workers.rank1_ends_late, args=(4.0, 2.0 if by_error else 7.0, by_error)
    )
    assert rank1["rank"] == 1
    assert rank0["rank"] == 0, rank0
    # the peer that left said so at once (no wait for the 4 s); the late one, at most those 4 s
    assert rank0["exit_s"] < (4.0 if by_error else 4.0 + 2.5), rank0

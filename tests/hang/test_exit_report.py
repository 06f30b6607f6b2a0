"""The end of a ``with multigpu.init()`` block runs no collective: a peer that does not come
cannot hold a finished rank longer than the context's timeout, nor fail it."""

from __future__ import annotations

from multigpu.testing import run_distributed
from tests.hang import exit_workers

# Each case tells "waited for the peer" from "did not" by a wide gap, not by how fast this machine
# tears a process group down: at load 7-11 on 2 cores rank 0's own end took over 0.1 s past a
# bound set at the timeout itself (exit_s 4.115 < 4.0).


def test_a_peer_that_left_by_an_error_does_not_hold_a_finished_rank() -> None:
    # Before: rank 0's straggler report was an all-gather at exit, which rank 1 did not join in
    # time: rank 0 failed at exit (a closed connection, gloo's timeout) after a run that succeeded.
    # A 60 s timeout: rank 1's leaving says so at once, so rank 0 is done long before it.
    rank0, rank1 = run_distributed(exit_workers.rank1_ends_late, args=(60.0, 2.0, True))
    assert rank1["rank"] == 1
    assert rank0["rank"] == 0, rank0
    assert rank0["exit_s"] < 30, rank0  # not the 60 s


def test_a_late_peer_holds_a_finished_rank_at_most_the_timeout() -> None:
    # Rank 1 comes 16 s late: rank 0 polls for it 4 s (the timeout), then ends; had it waited for
    # rank 1 it would have taken 16 s. The 6 s between are rank 0's own teardown under load.
    rank0, rank1 = run_distributed(exit_workers.rank1_ends_late, args=(4.0, 16.0, False))
    assert rank1["rank"] == 1
    assert rank0["rank"] == 0, rank0
    assert rank0["exit_s"] < 10.0, rank0  # not the 16 s

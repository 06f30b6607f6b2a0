"""Rank 1 is busy in its own evaluation (no collective) while rank 0 waits in an all_reduce."""

import time

import torch

import multigpu


def evaluate(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # slow, rank-local work: data loading, a long evaluation
        time.sleep(0.05)


with multigpu.init() as ctx:
    ctx.all_reduce(torch.ones(2))
    if ctx.rank == 1:
        evaluate(60)
    ctx.all_reduce(torch.ones(2))

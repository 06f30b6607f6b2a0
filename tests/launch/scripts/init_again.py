"""multigpu.init three times in the same workers, fsdp and ddp in turn (after each teardown)."""

import sys

import torch

import multigpu

for round_ in range(3):
    for strategy in ("fsdp", "ddp"):
        with multigpu.init(strategy=strategy) as ctx:
            model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
            optimizer = torch.optim.AdamW(model.parameters())
            model, optimizer = ctx.setup(model, optimizer)
            ctx.backward(model(torch.randn(4, 8)).sum())
            optimizer.step()
            total = ctx.all_reduce(torch.ones(1), op="sum")
            # One write per line: the two ranks share the pipe, and print() writes the line and
            # its newline apart, which the other rank's line can fall between.
            sys.stdout.write(f"rank {ctx.rank} round {round_} {strategy} world {int(total)}\n")
            sys.stdout.flush()

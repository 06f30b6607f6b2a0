"""A script that gives FSDP a model without parameters: every rank refuses, the run exits 2."""

import torch

import multigpu

with multigpu.init(strategy="fsdp") as ctx:
    ctx.setup(torch.nn.ReLU())

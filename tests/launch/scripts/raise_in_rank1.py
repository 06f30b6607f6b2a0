"""Rank 1 raises inside ``with multigpu.init()`` after one collective; rank 0 waits in another."""

import multigpu

with multigpu.init() as ctx:
    ctx.barrier()
    if ctx.rank == 1:
        raise ValueError("rank one is unhappy\nwith its input")
    ctx.barrier()  # loses its peer: a consequence, not the cause

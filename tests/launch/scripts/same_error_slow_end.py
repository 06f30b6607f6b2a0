"""Every rank raises the same error; rank 0's end is slow (its strategy's teardown waits 5 s, as a
process group whose peer is gone or a tracker's last write can): rank 1 ends first and its agent
stops rank 0 meanwhile."""

import time

import multigpu

with multigpu.init() as ctx:
    ctx.barrier()
    if ctx.rank == 0:
        teardown = ctx.strategy.teardown

        def slow_teardown() -> None:
            time.sleep(5.0)
            teardown()

        ctx.strategy.teardown = slow_teardown  # type: ignore[method-assign]
    raise ValueError("the same input is refused on every rank")

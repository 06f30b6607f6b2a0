"""Join the group, print ``ready RANK`` and touch ``ready-RANK`` beside the file ARGV[1], then
hold (sockets open) until ARGV[1] exists (60 s at most): a test lists what the launcher and the
workers listen on meanwhile."""

import sys
import time
from pathlib import Path

import multigpu

with multigpu.init() as ctx:
    ctx.all_reduce(1.0)
    print("ready", ctx.rank, flush=True)
    stop = Path(sys.argv[1])
    # A file too: the ranks' lines may interleave in a shared log ("readyready 0 \n1").
    (stop.parent / f"ready-{ctx.rank}").touch()
    deadline = time.monotonic() + 60
    while not stop.exists() and time.monotonic() < deadline:
        time.sleep(0.1)

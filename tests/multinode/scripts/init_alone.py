"""multigpu.init() outside any launcher; prints one JSON line: seconds in init, error if any.

Usage: RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. MULTIGPU_TIMEOUT=.. python init_alone.py
"""

import json
import time

import multigpu

init = multigpu.init  # imports the library (``import multigpu`` is lazy) before the clock runs
began = time.monotonic()
try:
    with init() as ctx:
        outcome = {"world_size": ctx.world_size, "sum": ctx.all_reduce(1.0, op="sum")}
except Exception as e:  # the test checks its type and message
    outcome = {"error": type(e).__name__, "message": str(e)}
outcome["seconds"] = time.monotonic() - began
print(json.dumps(outcome), flush=True)

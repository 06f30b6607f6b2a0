"""A worker whose hang watchdog is inside a store call when the script ends.

The store's server (another process) is frozen with SIGSTOP, so the watchdog's next poll waits
in ``store.check`` (the GIL released, in torch's C++). The script then stops the watchdog and
ends; its last object's ``__del__`` keeps interpreter finalization going for a second, and the
test thaws the server meanwhile. A watchdog thread still in the call then returns into a
finalizing interpreter: SIGABRT, "terminate called without an active exception".

Usage: python watchdog_at_exit.py STORE_PORT SERVER_PID
"""

import os
import signal
import sys
import time
from datetime import timedelta

import torch.distributed as tdist

from multigpu.instruments.hang.recorder import CollectiveLog
from multigpu.instruments.hang.watchdog import Watchdog


class SlowFinalization:
    def __del__(self) -> None:
        time.sleep(1.0)  # the GIL released, as during a real job's long finalization


port, server = int(sys.argv[1]), int(sys.argv[2])
store = tdist.TCPStore("127.0.0.1", port, 2, False, timeout=timedelta(seconds=30))
watchdog = Watchdog(CollectiveLog(), store, rank=1, world_size=2, after_s=60, poll_s=0.001)
watchdog.start()
time.sleep(0.2)
os.kill(server, signal.SIGSTOP)
time.sleep(0.2)  # the watchdog is now inside store.check, waiting for the frozen server
print("stopping", flush=True)  # the test thaws the server 0.3 s from now
stopped = watchdog.stop()
print(f"stopped={stopped}", flush=True)
last = SlowFinalization()

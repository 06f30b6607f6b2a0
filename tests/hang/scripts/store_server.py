"""A TCPStore server that lives until killed; prints its port once it listens."""

import time
from datetime import timedelta

import torch.distributed as tdist

store = tdist.TCPStore(
    "127.0.0.1", 0, 2, True, timeout=timedelta(seconds=60), wait_for_workers=False
)
print(store.port, flush=True)
while True:
    time.sleep(60)

"""Wait, within a deadline, until a TCP store's address accepts connections.

torch 2.13's TCPStore client does not keep to its timeout when nothing answers: each connect
try may take the whole timeout, and a failed try is retried after a random back-off (measured
here: 23 s with a 10 s timeout on a closed loopback port; 47 s with 20 s). Waiting here first,
with short tries and a hard deadline, bounds that wait by the timeout; once something listens,
torch's client connects at its first try.

Used by the workers (``multigpu.runtime.dist``, before the process group's store) and by the
launcher (``multigpu.launch.agent``, before the rendezvous store). Imports nothing of multigpu.
"""

from __future__ import annotations

import socket
import time

MAX_TRY_S = 2.0
"""The longest single connect try: a blackholed address then costs at most this beyond the
deadline's check, and a store that comes up meanwhile is seen within it."""


class StoreUnreachable(TimeoutError):
    """Nothing accepted a connection at the address within the deadline."""

    def __init__(self, host: str, port: int, waited_s: float, last_error: str) -> None:
        super().__init__(f"nothing accepted a connection at {host}:{port} in {waited_s:.0f} s")
        self.host = host
        self.port = port
        self.last_error = last_error


def wait_until_listening(host: str, port: int, timeout_s: float) -> float:
    """Return once a TCP connection to ``host:port`` succeeds (closed at once); the seconds left.

    Raises:
        StoreUnreachable: no connection within ``timeout_s`` (its ``last_error`` says how the
            last try failed: refused, timed out, no route...).
    """
    host = host.strip("[]")
    began = time.monotonic()
    deadline = began + timeout_s
    pause = 0.05
    last_error = "no try made"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise StoreUnreachable(host, port, time.monotonic() - began, last_error)
        try:
            socket.create_connection((host, port), timeout=min(left, MAX_TRY_S)).close()
            return max(0.0, deadline - time.monotonic())
        except OSError as e:  # refused (not listening yet), timed out (blackholed), no route
            last_error = _describe(e)
        time.sleep(max(0.0, min(pause, deadline - time.monotonic())))
        pause = min(pause * 2, 0.5)  # a store that comes up late is seen within 0.5 s


def _describe(error: OSError) -> str:
    if isinstance(error, TimeoutError):
        return "connect timed out (no answer at all: host down or packets dropped)"
    return error.strerror or type(error).__name__

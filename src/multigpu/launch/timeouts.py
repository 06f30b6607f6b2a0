"""``--timeout SECONDS``: one bound for every wait of a job — the workers' and the launcher's.

torch 2.13's own bounds are far too long for anyone watching a job, and one wait has none:

=============================  ==============  ==================================================
wait                           torch 2.13      with ``--timeout T`` (default 300 s)
=============================  ==============  ==================================================
a collective                   30 min          T (``MULTIGPU_TIMEOUT`` for the workers)
all nodes joining (c10d)       600 s           T (``join_timeout``)
one store call (c10d)          60 s            T (``read_timeout``; also connecting to the store)
node 0's store (static)        900 s           T (``timeout``)
more nodes after the minimum   30 s            min(30, T/3) (``last_call_timeout``)
a dead node leaves (c10d)      15 s            3 x min(5, max(1, T/10)) (3 missed keep-alives)
closing the rendezvous         30 s            min(30, T) (``close_timeout``)
other nodes finishing          300 s           T (the exit barrier; torchrun has no option)
a store whose host vanished    ~15 min, deaf   T + 5 s (the kernel's ``TCP_USER_TIMEOUT``)
                               to SIGTERM
=============================  ==============  ==================================================

The last row is the trap: when the host of the rendezvous store vanishes (link cut, power
loss), a store call of torch 2.13's TCPStore client waits for an answer until the kernel gives
up on the connection — about 15 minutes — whatever its own timeout says, and the agent, stuck in
native code, ignores SIGTERM (measured here: still waiting after 150 s with a 10 s store
timeout). A kernel TCP_USER_TIMEOUT on the launcher's store connections, set where the
stores are made (``multigpu.common.store_bound.store_call_bound``), makes such a call fail after
T + 5 s instead, and torch's own error path ends the agent. It never cuts a healthy
connection: it only counts data that the other side has not acknowledged. The 5 s let the
workers' own timeout (T) fire first, so their report of which rank is lost comes first.

One rule covers the exit barrier too: no node waits for another longer than T. So a node
whose workers end more than T after those of the node that hosts the store is cut off when that
node's launcher exits, as with torch's 300 s; give long final work (a big save on one rank) a
larger --timeout.

The last call (elastic ``--nnodes MIN:MAX``: how long to wait for more nodes once MIN have
joined) must end inside the join deadline, or a job with fewer than MAX nodes never starts —
hence T/3 when T is short. For the same reason a dead node must be dropped from the rendezvous
sooner than torch's 15 s when T is short: after a node is lost, the survivors' next rendezvous
first waits for the dead node's keep-alives to expire, then for the last call, and both must end
inside the join deadline (measured here: with T = 15 and torch's keep-alive, 1 of 2 elastic
restarts after a node loss timed out). Rendezvous options the user gave in ``--rdzv-conf`` win
over these.

Environment variables read: ``MULTIGPU_TIMEOUT`` (the default of ``--timeout``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from multigpu.common import variables
from multigpu.common.store_bound import store_call_bound
from multigpu.common.variables import DEFAULT_TIMEOUT_S

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "STORE_GRACE_S",
    "job_timeout_s",
    "rendezvous_conf",
    "store_call_bound",
]


# The default bound (300 s) is the workers' default collective timeout (multigpu.common.variables),
# 10x below torch's 30 minutes yet above any collective of a healthy job (a checkpoint gather).

SHORT_WAIT_S = 30
"""torch's default for the waits that only add to a rendezvous (last call, close)."""

STORE_GRACE_S = 5.0
"""How much later than the workers' timeout a launcher's store call to a vanished host fails."""


def job_timeout_s(given: float | None, environ: Mapping[str, str]) -> float:
    """The job's bound: ``--timeout``, else ``MULTIGPU_TIMEOUT``, else 300 s."""
    return given if given is not None else variables.timeout(environ, DEFAULT_TIMEOUT_S)


def _parse_conf(text: str) -> dict[str, str]:
    conf: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, _, value = item.partition("=")
        conf[key.strip()] = value.strip()
    return conf


def rendezvous_conf(given: str, timeout_s: float, *, static: bool) -> str:
    """``--rdzv-conf`` with the bounds of ``timeout_s`` added where the user set none.

    Example:
        >>> rendezvous_conf("join_timeout=900", 60, static=False).split(",")
        ... # doctest: +NORMALIZE_WHITESPACE
        ['join_timeout=900', 'read_timeout=60', 'last_call_timeout=20', 'close_timeout=30',
         'keep_alive_interval=5', 'keep_alive_max_attempt=3']
        >>> rendezvous_conf("", 10, static=True)
        'timeout=10'
    """
    seconds = math.ceil(timeout_s)  # torch reads these with int()
    short = min(SHORT_WAIT_S, seconds)
    last_call = max(1, min(SHORT_WAIT_S, seconds // 3))  # ends before the join deadline
    if static:
        ours = {"timeout": seconds}
    else:
        ours = {
            "join_timeout": seconds,
            "read_timeout": seconds,
            "last_call_timeout": last_call,
            "close_timeout": short,
            "keep_alive_interval": min(5, max(1, seconds // 10)),
            "keep_alive_max_attempt": 3,
        }
    conf = _parse_conf(given)
    for key, value in ours.items():
        conf.setdefault(key, str(value))
    return ",".join(f"{k}={v}" if v else k for k, v in conf.items())

"""CPU seconds, for tests whose claim is about work done (no worker started, no probe process)
rather than about how fast this machine is: on a loaded machine wall time grows with the load,
CPU time hardly."""

from __future__ import annotations

import resource


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of every process it has waited for (and
    each of those of theirs: a launcher's workers count once the launcher has ended)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    waited = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + waited.ru_utime + waited.ru_stime

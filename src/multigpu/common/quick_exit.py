"""A process that ends without the garbage collector's last pass over everything torch made.

At exit Python collects every object once more before it frees the modules. In a process that
imported torch that pass takes about 0.5 s of CPU, 0.8-1 s once DDP has imported
``torch._dynamo`` (measured on 2 cores, torch 2.13): every worker and every launcher paid it at
the end of every run. What it does is call ``__del__`` on objects caught in reference cycles,
which Python does not promise at exit anyway; the process group, checkpoints, trackers and files
are closed by the Context's teardown or by reference counting, and the rest by the operating
system. ``skip_final_collection()`` freezes every object that exists when the exit handlers run
(``gc.freeze``): the last pass then has nothing to visit, and objects made after that (by the
exit handlers that run later) are still collected.
"""

from __future__ import annotations

import atexit
import gc

_registered: list[bool] = []


def skip_final_collection() -> None:
    """At exit, leave the objects of this process out of the garbage collector's last pass
    (see the module doc). Called by ``multigpu.init()`` and the ``multigpu`` command; once per
    process."""
    if not _registered:
        _registered.append(True)
        atexit.register(gc.freeze)

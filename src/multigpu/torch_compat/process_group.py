"""The default process group's timeout, read and changed after the group exists.

``torch.distributed`` takes a group's timeout at ``init_process_group`` only; a group someone
else made (Ray Train's, 1800 s by default) is changed through the private
``distributed_c10d._set_pg_timeout`` (torch 2.3+: every gloo and NCCL backend of the group) and
read back through the gloo backend's ``options._timeout``.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

import torch


def set_group_timeout(timeout: timedelta) -> None:
    """Give the default group's backends and its store ``timeout``, for every collective and
    store wait from now on (``_set_pg_timeout`` warns, and changes nothing, for a backend other
    than gloo and NCCL)."""
    from torch.distributed.distributed_c10d import _get_default_store, _set_pg_timeout

    _set_pg_timeout(timeout)
    with contextlib.suppress(RuntimeError, ValueError):  # a group made without a store
        _get_default_store().set_timeout(timeout)


def group_timeout() -> timedelta | None:
    """The timeout of the default group's gloo backend (the CPU's), or None without one."""
    from torch.distributed.distributed_c10d import _get_default_group

    try:
        backend = _get_default_group()._get_backend(torch.device("cpu"))
        return backend.options._timeout
    except (RuntimeError, ValueError, AttributeError):
        return None

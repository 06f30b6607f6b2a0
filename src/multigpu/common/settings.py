"""Settings: what ``multigpu.init()`` takes from its environment mapping, read once at the top.

``init(environ=...)`` resolves the mapping here and passes the typed values down, so the device
choice, the timeout and the process group never read ``os.environ`` behind the caller's back
(a test, a notebook or an embedding program gives its own mapping and gets exactly that).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from multigpu.common import variables

DEFAULT_TIMEOUT_S = 300.0
"""A collective's bound when neither ``timeout=`` nor ``MULTIGPU_TIMEOUT`` gives one."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    """The ``MULTIGPU_*`` values (and ``CUDA_VISIBLE_DEVICES``) of one environment, checked."""

    strategy: str
    """``MULTIGPU_STRATEGY`` (``auto`` when unset)."""
    backend: str
    """``MULTIGPU_BACKEND`` (``auto`` when unset)."""
    device: str
    """``MULTIGPU_DEVICE``: ``cpu`` keeps the rank on the CPU; ``auto``: CUDA when present."""
    deterministic: bool
    """``MULTIGPU_DETERMINISTIC``."""
    timeout_s: float
    """``MULTIGPU_TIMEOUT``, else ``DEFAULT_TIMEOUT_S``."""
    cuda_visible_devices: str | None
    """As given (for messages: which GPUs this process was shown)."""
    profile: tuple[int, int] | None = None
    """``MULTIGPU_PROFILE``: the optimizer steps to trace."""
    profile_dir: str | None = None
    """``MULTIGPU_PROFILE_DIR``: where the traces go."""
    log_to: tuple[str, ...] = ()
    """``MULTIGPU_LOG_TO``: the experiment trackers (none when unset)."""
    log_dir: str | None = None
    """``MULTIGPU_LOG_DIR``: the trackers' directory (None: ``init``'s default)."""
    compile: str | None = None
    """``MULTIGPU_COMPILE``: the ``torch.compile`` backend (None: off)."""

    @classmethod
    def read(cls, environ: Mapping[str, str]) -> Settings:
        """Read and check every value ``init()`` uses; the first bad one raises UsageError.

        Variables read later by the hooks (``MULTIGPU_WATCHDOG``, ``MULTIGPU_HANG_AFTER``) and
        by the strategy (``MULTIGPU_COMPRESSION``, ``MULTIGPU_MESH``) are checked here too, so
        a bad value stops ``init()`` before any process group exists.
        """
        variables.check_environment(environ)
        return cls(
            strategy=variables.strategy(environ),
            backend=variables.backend(environ),
            device=variables.device(environ),
            deterministic=variables.deterministic(environ),
            timeout_s=variables.timeout(environ, DEFAULT_TIMEOUT_S),
            cuda_visible_devices=environ.get("CUDA_VISIBLE_DEVICES"),
            profile=variables.profile(environ),
            profile_dir=variables.profile_dir(environ),
            log_to=variables.log_to(environ),
            log_dir=variables.log_dir(environ),
            compile=variables.compile_backend(environ),
        )

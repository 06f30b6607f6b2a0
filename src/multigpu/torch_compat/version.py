"""The installed torch's version, for the gates of ``multigpu.torch_compat``."""

from __future__ import annotations

import torch

TORCH_VERSION: tuple[int, int] = tuple(  # type: ignore[assignment]
    int(part) for part in torch.__version__.split("+")[0].split(".")[:2]
)
"""(major, minor) of the installed torch."""

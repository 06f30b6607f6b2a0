"""``unwrap_module``: the plain model inside DataParallel, DDP, torch.compile and autocast wrappers.

Kept apart from the strategies so that code below them (checkpoints, portable loading) can
unwrap a model too.
"""

from __future__ import annotations

from torch import nn

from multigpu.precision import AutocastModule

_WRAPPERS = (nn.DataParallel, nn.parallel.DistributedDataParallel, AutocastModule)


def unwrap_module(module: nn.Module) -> nn.Module:
    """Strip DataParallel/DDP (``module.``), torch.compile (``_orig_mod``) and autocast wrappers."""
    while True:
        if isinstance(module, _WRAPPERS):
            module = module.module
        elif hasattr(module, "_orig_mod") and isinstance(module._orig_mod, nn.Module):
            module = module._orig_mod
        else:
            return module

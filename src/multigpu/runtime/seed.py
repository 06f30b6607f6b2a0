"""Seed every random number generator from one seed."""

from __future__ import annotations

import random

import numpy as np
import torch

from multigpu.errors import UsageError


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy, torch (CPU) and every CUDA device with ``seed``.

    Every rank uses the same seed, so models are created identically everywhere; data order does
    not depend on it per rank (the loader derives its own generator from the seed and the epoch).
    """
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32:
        raise UsageError(f"seed={seed!r} must be an integer in [0, 2**32); give e.g. seed=0")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device, lazily

"""Capture and restore one rank's random number generators: Python, NumPy, torch, CUDA.

The captured state holds only what ``torch.load(..., weights_only=True)`` accepts: NumPy's key
array becomes a torch tensor (NumPy arrays are not on torch's safe list).
"""

from __future__ import annotations

import logging
import random
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)


def capture_rng() -> dict[str, Any]:
    """This process's RNG states, ready for ``torch.save``."""
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)
    assert isinstance(np_state, dict)  # legacy=False always gives the dict form
    inner = np_state["state"]
    return {
        "python": {"version": version, "state": list(internal), "gauss": gauss},
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": torch.from_numpy(np.asarray(inner["key"], dtype=np.int64)),
            "pos": int(inner["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng(state: dict[str, Any]) -> None:
    """Put back what ``capture_rng`` returned (CUDA only when the device count matches).

    Example:
        >>> s = capture_rng(); a = torch.rand(1); restore_rng(s); bool(a == torch.rand(1))
        True
    """
    py = state["python"]
    random.setstate((int(py["version"]), tuple(int(x) for x in py["state"]), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": npy["bit_generator"],
            "state": {"key": npy["key"].numpy().astype(np.uint32), "pos": int(npy["pos"])},
            "has_gauss": int(npy["has_gauss"]),
            "gauss": float(npy["gauss"]),
        }
    )
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda") or []
    if cuda and torch.cuda.is_available():
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:
            log.warning(
                "the checkpoint holds the RNG state of %d CUDA devices, this process sees %d: "
                "CUDA RNG states not restored",
                len(cuda),
                torch.cuda.device_count(),
            )

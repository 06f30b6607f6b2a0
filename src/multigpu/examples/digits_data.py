"""The digits job's data: scikit-learn's bundled 8×8 digits, split 80/20 into train and test.

scikit-learn makes the split (``load_digits``, a stratified ``train_test_split`` with seed 0),
but importing it costs every worker of every run 1.5-2 s of CPU (scipy underneath) for 1797 small
images whose split is the same each time for one scikit-learn and numpy. So the first run keeps
the split in the cache directory (``variables.cache_dir``: ``$MULTIGPU_CACHE_DIR``, else
``~/.cache/multigpu``) under a name that carries both versions, and later runs read that file
(a few milliseconds). A cache that cannot be written or read (read-only home, a damaged file) is
passed over: the split is then made again, as before.
"""

from __future__ import annotations

import importlib.metadata
import logging
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

from multigpu.common import variables
from multigpu.common.atomic_file import atomic_write
from multigpu.errors import UsageError

log = logging.getLogger(__name__)

TEST_SHARE = 0.2
SPLIT_SEED = 0


def load_digits_split() -> tuple[TensorDataset, TensorDataset]:
    """The digits as (train, test) tensor datasets, pixels scaled to [0, 1].

    Raises:
        UsageError: scikit-learn is not installed.
    """
    path = _cache_file()
    tensors = _cached(path)
    if tensors is None:
        tensors = _made_with_sklearn()
        _keep(tensors, path)
    images, labels, train, test = tensors
    x = images.to(torch.float32).unsqueeze(1) / 16.0
    return TensorDataset(x[train], labels[train]), TensorDataset(x[test], labels[test])


Split = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
"""images (uint8, N×8×8, values 0-16), labels (int64), train indices, test indices."""


def _cache_file() -> Path | None:
    try:  # versions from the installed metadata: nothing is imported to read them
        sklearn = importlib.metadata.version("scikit-learn")
        numpy = importlib.metadata.version("numpy")
    except importlib.metadata.PackageNotFoundError:
        return None  # scikit-learn missing: _made_with_sklearn says how to install it
    return variables.cache_dir() / f"digits-split-sklearn{sklearn}-numpy{numpy}.pt"


def _cached(path: Path | None) -> Split | None:
    if path is None or not path.is_file():
        return None
    try:
        saved = torch.load(path, weights_only=True)
        tensors = tuple(saved[k] for k in ("images", "labels", "train", "test"))
    except Exception as e:  # damaged or foreign: made again (and rewritten) below
        log.debug("digits cache %s not read: %s", path, e)
        return None
    return tensors


def _keep(tensors: Split, path: Path | None) -> None:
    if path is None:
        return
    saved = dict(zip(("images", "labels", "train", "test"), tensors, strict=True))
    try:  # atomic: ranks that make it at the same time each rename a whole file into place
        atomic_write(path, lambda fh: torch.save(saved, fh), durable=False)
    except OSError as e:
        log.debug("digits cache %s not written: %s", path, e)


def _made_with_sklearn() -> Split:
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as e:
        raise UsageError(
            "the digits job needs scikit-learn, which is not installed; "
            "run: pip install 'multigpu[examples]'"
        ) from e
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.uint8)  # whole numbers 0-16
    labels = torch.tensor(digits.target, dtype=torch.long)
    train, test = train_test_split(
        list(range(len(labels))),
        test_size=TEST_SHARE,
        random_state=SPLIT_SEED,
        stratify=digits.target,
    )
    return images, labels, torch.tensor(train), torch.tensor(test)

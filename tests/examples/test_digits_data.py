"""The digits split: made by scikit-learn once, then read from the cache without importing it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from multigpu.examples import digits_data

pytest.importorskip("sklearn")


def _split(cache: Path) -> tuple[torch.Tensor, ...]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MULTIGPU_CACHE_DIR", str(cache))
        train, test = digits_data.load_digits_split()
    return (*train.tensors, *test.tensors)


def test_the_split_is_scikit_learns_and_a_later_run_does_not_import_it(tmp_path: Path) -> None:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target)
    train, test = train_test_split(
        list(range(len(y))), test_size=0.2, random_state=0, stratify=digits.target
    )
    expected = (x[train], y[train], x[test], y[test])
    made = _split(tmp_path)
    (kept,) = tmp_path.iterdir()
    assert kept.name.startswith("digits-split-sklearn")
    read_back = (
        "import sys\n"
        "from multigpu.examples.digits_data import load_digits_split\n"
        "train, test = load_digits_split()\n"
        "print(len(train), len(test), 'sklearn' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", read_back],
        env={"PATH": "/usr/bin:/bin", "MULTIGPU_CACHE_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout) == (0, "1437 360 False\n"), done.stderr
    for got in (made, _split(tmp_path)):
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def test_a_damaged_or_unwritable_cache_is_passed_over(tmp_path: Path) -> None:
    reference = _split(tmp_path / "good")
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / (tmp_path / "good").iterdir().__next__().name).write_bytes(b"not a torch file")
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    for cache in (damaged, blocked / "cache"):  # made again; rewritten where it can be
        assert all(torch.equal(a, b) for a, b in zip(_split(cache), reference, strict=True))
    assert torch.load(next(damaged.iterdir()), weights_only=True)["images"].shape == (1797, 8, 8)

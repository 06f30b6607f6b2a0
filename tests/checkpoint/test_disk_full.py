"""A disk that fills during a save: one line on every rank, nothing partial left, resume intact.

A 2 MiB tmpfs (mounting needs root) holds the checkpoint directory; the saves that do not fit
fail while DCP writes (synchronous and background), while the rank files are written, and before
anything is written (the estimate exceeds the free space). Torch alone says "unexpected pos" and
leaves the temp dir, holding the space.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from multigpu.testing import run_distributed
from tests.checkpoint import disk_full_workers

FAILED = ("dcp", "async", "rank file", "refused")


def _check(results: list[dict[str, Any]], directory: Path) -> None:
    first = results[0]
    assert first["first"] == "saved"
    for name in FAILED:
        said = first[name]
        assert said.startswith("DiskFullError: "), (name, said)
        assert "No space left on device" in said and str(directory) in said, (name, said)
        assert " bytes " in said and "\n" not in said, (name, said)
        assert all(r[name] == said for r in results), (name, [r[name] for r in results])
        # No partial directory: only the complete checkpoint of step 3 is left.
        assert first[name + " left"] == ["step-00000003"], (name, first[name + " left"])
    assert "the save needs about" in first["refused"] and "were free" in first["refused"]
    assert all(r["resumed"] == 3 and r["restored"] for r in results)


@pytest.mark.parametrize("world_size", [1, 2])
def test_a_full_disk_is_one_line_on_every_rank_leaves_no_partial_save_and_resume_works(
    small_disk: Path, world_size: int
) -> None:
    directory = small_disk / "ckpt"
    results = run_distributed(
        disk_full_workers.fill_the_disk,
        world_size=world_size,
        args=(str(directory), str(small_disk / "filler")),
    )
    _check(results, directory)


def test_torchs_unexpected_pos_on_a_full_disk_is_said_as_a_full_disk(small_disk: Path) -> None:
    """torch's writer turns ENOSPC into "unexpected pos"; the OSError is only its context."""
    import torch

    from multigpu.checkpoint.native.sharded import _disk_full_said
    from multigpu.checkpoint.native.space import DiskFullError, ran_out_of_space

    with (
        pytest.raises(DiskFullError) as caught,
        _disk_full_said(small_disk),
        (small_disk / "big.pt").open("wb") as fh,
    ):
        torch.save(torch.zeros(1 << 20), fh)  # 4 MiB on a 2 MiB disk
    assert "unexpected pos" in str(caught.value.__cause__)
    assert ran_out_of_space(caught.value.__cause__)  # type: ignore[arg-type]
    assert str(caught.value) == f"No space left on device writing to {small_disk}"


def test_a_file_system_that_reports_no_size_is_not_refused_before_writing(tmp_path: Path) -> None:
    """Some FUSE and object-store mounts report 0 blocks: unknown free space, not a full disk."""
    from multigpu.checkpoint.native.space import SaveSpace

    unknown = SaveSpace(tmp_path, needed=1 << 30, free=-1)
    assert unknown.fits()
    assert "the file system does not report its free space" in unknown.full_line()
    assert not SaveSpace(tmp_path, needed=1 << 30, free=1 << 20).fits()


def test_a_run_whose_disk_fills_ends_in_one_line(small_disk: Path) -> None:
    """``multigpu run``: no traceback from any rank, one line naming the rank, host, space and
    directory (torch's own ending was 166 lines)."""
    from tests.launch._util import run_multigpu

    script = Path(__file__).parent / "scripts" / "fill_disk_run.py"
    directory = small_disk / "ckpt"
    done = run_multigpu(["run", "--cpu", "2", str(script), str(directory)], small_disk)
    lines = [line for line in done.stderr.splitlines() if not line.startswith("multigpu: strat")]
    assert done.returncode == 1, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"multigpu: error: rank 0 on {socket.gethostname()} failed: ")
    assert "DiskFullError: checkpoint of step 1 was not saved: No space left on device" in lines[0]
    assert f"of {directory} (mounted at {small_disk})" in lines[0] and "were free" in lines[0]
    assert sorted(p.name for p in directory.iterdir()) == []  # no partial save, no lock left

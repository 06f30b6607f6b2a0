"""atomic_write: the file appears whole or not at all, with the mode a plain open() gives it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from multigpu.common.atomic_file import atomic_write, current_umask


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_the_file_gets_the_umasks_mode_not_mkstemps_0600(
    tmp_path: Path, umask: int, mode: int
) -> None:
    # model.pt and metrics.json came out 0600 whatever the umask (issue 17): mkstemp's mode.
    old = os.umask(umask)
    try:
        assert current_umask() == umask
        written = atomic_write(tmp_path / "model.pt", lambda fh: fh.write(b"x"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(written.stat().st_mode) == mode


def test_a_failing_write_leaves_neither_the_file_nor_a_temporary(tmp_path: Path) -> None:
    def fail(fh: object) -> None:
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        atomic_write(tmp_path / "metrics.json", fail)
    assert list(tmp_path.iterdir()) == []


def test_replacing_keeps_the_old_file_until_the_new_one_is_whole(tmp_path: Path) -> None:
    target = tmp_path / "metrics.json"
    atomic_write(target, lambda fh: fh.write(b"old"))
    with pytest.raises(RuntimeError):
        atomic_write(target, lambda fh: (fh.write(b"half"), (_ for _ in ()).throw(RuntimeError)))
    assert target.read_bytes() == b"old"

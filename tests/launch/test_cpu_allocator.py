"""The CPU workers' allocator: the choice (pure) and what real workers of ``multigpu run`` load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multigpu.errors import UsageError
from multigpu.launch.cpu_allocator import LIBRARIES, choose_allocator, tbb_libraries

from ._util import run_multigpu

LIBS = ("/x/libtbbmalloc.so.2", "/x/libtbbmalloc_proxy.so.2")

# Each worker writes which allocator its process runs on, and that glibc's malloc is not it.
SCRIPT = """
import json, os, sys
maps = open("/proc/self/maps").read()
rank = os.environ["RANK"]
out = {"proxy": "libtbbmalloc_proxy" in maps, "ld_preload": os.environ.get("LD_PRELOAD", "")}
open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w").write(json.dumps(out))
"""


def test_auto_preloads_tbb_into_cpu_workers_only() -> None:
    cpu = choose_allocator({}, device="cpu", libraries=LIBS)
    assert cpu.name == "tbb" and cpu.env == {"LD_PRELOAD": ":".join(LIBS)}
    gpu = choose_allocator({}, device="cuda", libraries=LIBS)
    assert gpu.name == "system" and gpu.env == {}


def test_system_and_a_users_preload_are_left_alone() -> None:
    off = choose_allocator({"MULTIGPU_CPU_ALLOCATOR": "system"}, device="cpu", libraries=LIBS)
    assert off.name == "system" and off.env == {} and not off.note
    theirs = choose_allocator({"LD_PRELOAD": "/opt/libjemalloc.so"}, device="cpu", libraries=LIBS)
    assert theirs.env == {} and "LD_PRELOAD is set (/opt/libjemalloc.so)" in theirs.note
    # Asked for by name: ours first, then the user's.
    both = choose_allocator(
        {"LD_PRELOAD": "/opt/libx.so", "MULTIGPU_CPU_ALLOCATOR": " TBB "}, device="cuda",
        libraries=LIBS,
    )  # fmt: skip
    assert both.env["LD_PRELOAD"] == ":".join([*LIBS, "/opt/libx.so"])


def test_missing_tbb_is_the_system_allocator_by_default_and_an_error_when_asked_for() -> None:
    quiet = choose_allocator({}, device="cpu", libraries=None)
    assert quiet.name == "system" and quiet.env == {} and not quiet.note
    with pytest.raises(UsageError, match=r"MULTIGPU_CPU_ALLOCATOR=tbb but .*pip install tbb"):
        choose_allocator({"MULTIGPU_CPU_ALLOCATOR": "tbb"}, device="cpu", libraries=None)
    with pytest.raises(UsageError, match=r"MULTIGPU_CPU_ALLOCATOR='jemalloc'; expected one of"):
        choose_allocator({"MULTIGPU_CPU_ALLOCATOR": "jemalloc"}, device="cpu", libraries=LIBS)


def test_the_installed_tbb_wheel_has_both_libraries() -> None:
    # The package is a dependency on Linux x86_64: the lookup must find its files there, and a
    # renamed library in a new tbb release fails here rather than silently falling back.
    found = tbb_libraries()
    assert found is not None, "tbb is installed with multigpu on Linux x86_64"
    assert [Path(p).name for p in found] == list(LIBRARIES)
    assert all(Path(p).is_absolute() and Path(p).is_file() for p in found)


@pytest.mark.parametrize("choice", ["auto", "system"])
def test_real_cpu_workers_run_on_the_chosen_allocator(tmp_path: Path, choice: str) -> None:
    script = tmp_path / "which.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    result = run_multigpu(
        ["run", "--cpu", "2", str(script), str(out)], tmp_path, MULTIGPU_CPU_ALLOCATOR=choice
    )
    assert result.returncode == 0, result.stderr
    for rank in (0, 1):
        seen = json.loads((out / f"rank{rank}.json").read_text())
        assert seen["proxy"] is (choice == "auto"), seen
    if choice == "auto":
        return
    error = run_multigpu(
        ["run", "--cpu", "2", str(script), str(out)], tmp_path, MULTIGPU_CPU_ALLOCATOR="mine"
    )
    assert error.returncode == 2 and error.stderr.count("\n") == 1, error.stderr
    assert "MULTIGPU_CPU_ALLOCATOR='mine'; expected one of auto, tbb, system" in error.stderr

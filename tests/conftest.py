"""Shared fixtures: a ``requires`` marker for skips, and guards against leaked state."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# --fast and --record-durations; --summary; a test process that dies, hangs past its timeout or
# leaves processes running fails the run with the test named
pytest_plugins = ["tests.fast_subset", "tests.progress_summary", "tests.worker_guard"]


def _condition(name: str) -> tuple[bool, str]:
    if name == "root":
        return os.geteuid() == 0, "needs root (network namespaces)"
    if name.startswith("gpus>="):
        import torch

        need = int(name.split(">=", 1)[1])
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return have >= need, f"needs {need} CUDA GPUs, found {have}"
    if name == "no-gpus":  # what a CPU-only machine does by default (its GPU twin is tested too)
        from multigpu.gpus import list_gpus

        have = len(list_gpus())
        return have == 0, f"a CPU-only machine's default; this one has {have} GPU(s)"
    if name.startswith("module:"):
        import importlib.util

        mod = name.split(":", 1)[1]
        return importlib.util.find_spec(mod) is not None, f"needs the Python module {mod}"
    if name.startswith("command:"):
        cmd = name.split(":", 1)[1]
        return shutil.which(cmd) is not None, f"needs the command {cmd}"
    raise ValueError(f"unknown requires() condition {name!r}")


def pytest_configure(config: pytest.Config) -> None:
    # A shell starts a background job (`./scripts/test > log &`, and some CI runners) with SIGINT
    # ignored, and that is inherited across exec: the tests that send a worker Ctrl-C saw it
    # ignored (exit 0 after its sleep) in such runs only. Python's own handler, as a terminal
    # gives it, before xdist starts the test processes from this one.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for marker in item.iter_markers("requires"):
            for name in marker.args:
                ok, why = _condition(name)
                if not ok:
                    item.add_marker(pytest.mark.skip(reason=why))


# pytest rewrites PYTEST_CURRENT_TEST at every phase; torch.compile records its cache folder
# (and inductor's CPU kernels a pointer they read back); importing transformers on the lent GPU
# machine's image set Intel OpenMP's two KMP_ variables.
_SET_BY_TOOLS = frozenset(
    {
        "PYTEST_CURRENT_TEST",
        "TORCHINDUCTOR_CACHE_DIR",
        "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR",
        "KMP_DUPLICATE_LIB_OK",
        "KMP_INIT_AT_FORK",
    }
)


# What a child inherits across exec: an ignored signal stays ignored there (a worker that ignores
# SIGINT cannot be stopped by Ctrl-C, nor by the tests that send it one).
_INHERITED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@pytest.fixture(autouse=True)
def _no_leaked_state():
    """Fail a test that leaves environment variables changed, a process group alive or a signal
    ignored."""
    before = dict(os.environ)
    handlers = {s: signal.getsignal(s) for s in _INHERITED_SIGNALS}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    ignored = sorted(
        s.name
        for s in _INHERITED_SIGNALS
        if signal.getsignal(s) == signal.SIG_IGN and handlers[s] != signal.SIG_IGN
    )
    ignored += sorted(f"{s.name} (blocked)" for s in _INHERITED_SIGNALS if s in (
        signal.pthread_sigmask(signal.SIG_BLOCK, []) - blocked))  # fmt: skip
    for s, handler in handlers.items():
        if handler is not None:
            signal.signal(s, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    after = dict(os.environ)
    changed = sorted(
        k
        for k in set(before) | set(after)
        if before.get(k) != after.get(k) and k not in _SET_BY_TOOLS
    )
    os.environ.clear()
    os.environ.update(before)
    import torch.distributed as dist

    leaked_pg = dist.is_available() and dist.is_initialized()
    if leaked_pg:
        dist.destroy_process_group()
    assert not changed, f"test leaked environment variables: {changed}"
    assert not leaked_pg, "test leaked an initialised process group"
    assert not ignored, f"test left {ignored} ignored (the processes it starts inherit that)"


@pytest.fixture(autouse=True)
def _cpu_unless_a_gpu_test(
    request: pytest.FixtureRequest, _no_leaked_state: None
) -> Iterator[None]:
    """CPU processes for every test not marked ``requires("gpus>=N")``, GPUs or not.

    On a GPU machine ``multigpu.init()`` would otherwise take ``cuda:LOCAL_RANK``: the CPU
    tests' expectations (gloo, two ranks on a one-GPU machine) hold only on the CPU. Set after
    and undone before the leak check (it depends on it).
    """
    wants_gpu = any(
        str(name).startswith("gpus>=")
        for marker in request.node.iter_markers("requires")
        for name in marker.args
    )
    before = os.environ.get("MULTIGPU_DEVICE")
    if not wants_gpu:
        os.environ["MULTIGPU_DEVICE"] = "cpu"
    yield
    if before is None:
        os.environ.pop("MULTIGPU_DEVICE", None)
    else:
        os.environ["MULTIGPU_DEVICE"] = before


@pytest.fixture
def python() -> str:
    """The interpreter running the tests (workers and CLI subprocesses use the same)."""
    return sys.executable


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs mounted at tmp_path/disk, unmounted afterwards (a full disk for the tests
    of what a run says when it runs out of space; root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)

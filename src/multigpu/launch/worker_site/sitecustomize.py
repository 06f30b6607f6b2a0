"""Run by Python at the start of every CPU worker of ``multigpu run`` (its directory is first on
their ``PYTHONPATH``): a script written for GPUs says why it cannot run here, in one line.

The PyTorch DDP tutorial run unchanged with ``multigpu run --cpu 2`` ended in torch's
``Distributed package doesn't have NCCL built in`` twice, each with its traceback, and the
launcher's "exited with code 1 ... its output is above": nothing said that the run is on CPU
processes, where ``init_process_group("nccl")`` or ``.cuda()`` cannot work. A plain script
imports nothing of multigpu, so the only place to say it is here: an exception hook, set before
the script runs, that takes only an uncaught error asking for CUDA or NCCL, records it for the
launcher's one-line summary (a usage error, exit code 2) and prints nothing; every other error
goes to Python's own hook as before.

Standard library only until such an error comes (then ``multigpu.common.worker_error``). A
``sitecustomize`` that was there before (Debian's Python has one) still runs: the next one on
the path is loaded after this one.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import warnings
from types import TracebackType

_CUDA_WORDS = (
    "doesn't have NCCL built in",
    "ProcessGroupNCCL is only supported with GPUs",
    "Torch not compiled with CUDA enabled",
    "No CUDA GPUs are available",
    "Found no NVIDIA driver",
    "invalid device ordinal",
)
"""How torch says that a CPU process was asked for CUDA or NCCL."""


def cpu_message(error: BaseException, processes: str) -> str | None:
    """The one line for ``error`` in a CPU run of ``processes`` workers, or None when it is no
    request for CUDA or NCCL.

    Example:
        >>> print(cpu_message(RuntimeError("Distributed package doesn't have NCCL built in"), "2"))
        this run is on CPU processes (2 per node, no GPU), where the script's request for NCCL \
or CUDA fails (Distributed package doesn't have NCCL built in); use the "gloo" backend \
(dist.init_process_group("gloo")) and device "cpu" there, or let multigpu.init() choose both, or \
run on GPUs with --gpus
    """
    text = str(error)
    if not any(word in text for word in _CUDA_WORDS):
        return None
    first = (text.strip().splitlines() or [type(error).__name__])[0]
    return (
        f"this run is on CPU processes ({processes} per node, no GPU), where the script's "
        f'request for NCCL or CUDA fails ({first}); use the "gloo" backend '
        '(dist.init_process_group("gloo")) and device "cpu" there, or let multigpu.init() '
        "choose both, or run on GPUs with --gpus"
    )


def _hook(
    previous: object,
) -> object:
    def hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        line = cpu_message(error, os.environ.get("LOCAL_WORLD_SIZE", "?"))
        if line is not None:
            try:
                from multigpu.common import worker_error
                from multigpu.errors import UsageError

                said = UsageError(line)
                if worker_error.record(said):
                    return  # the launcher says it, once for every rank
            except Exception:  # never hide the error itself
                pass
        previous(kind, error, tb)  # type: ignore[operator]

    return hook


def _run_the_next_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if os.environ.get("MULTIGPU_DEVICE") == "cpu" and os.environ.get("MULTIGPU_AGENT_PID"):
    sys.excepthook = _hook(sys.excepthook)  # type: ignore[assignment]
    # torch's warning as init_process_group("nccl") starts: the one line above says more.
    warnings.filterwarnings("ignore", message="Attempted to get default timeout for nccl")
_run_the_next_sitecustomize()

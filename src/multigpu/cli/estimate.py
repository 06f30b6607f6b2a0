"""``multigpu estimate TARGET``: a model's memory per rank under each strategy, and what fits.

TARGET is a built-in job's model (``digits``, ``lm``) or ``pkg.module:factory`` /
``path/to/file.py:factory``, a callable returning an ``nn.Module``. The model is built on the meta
device: nothing is allocated, so a model far larger than this machine can be asked about (a
file is imported under its own name, not ``__main__``: its ``if __name__ == "__main__"`` block
does not run). The devices are those found here: the GPUs (NVML, then nvidia-smi; no CUDA
context), the ``--nproc`` with the most free memory as the launcher picks them, else this
machine's RAM shared by ``--nproc`` CPU processes (and any memory limit on this process).

``--nproc`` defaults to the GPUs found, else 1 — what ``multigpu run`` starts by default — so
ask for ``--nproc 2`` (or ``--cpu 2`` on a GPU machine) to compare sharded with replicated.

Environment variables read: ``CUDA_VISIBLE_DEVICES`` (through ``multigpu.gpus``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import runpy
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from rich.console import Console
from torch import nn

from multigpu.cli.estimate_script import model_of_script
from multigpu.common.arguments import Parser, processes_arg
from multigpu.errors import UsageError
from multigpu.estimate import Capacity, cpu_capacity, estimate_memory, gpus_capacity
from multigpu.estimate.memory import DEFAULT_MIN_BLOCK_PARAMS, PRECISIONS, MemoryEstimate
from multigpu.estimate.optimizers import STATES_PER_PARAM
from multigpu.estimate.render import WIDTH, as_json, rich_view, size

PROG = "multigpu estimate"
BUILTIN = {
    "digits": ("multigpu.examples.digits", "DigitsCNN"),
    "lm": ("multigpu.examples.lm", "build_model"),
}


def build_parser() -> argparse.ArgumentParser:
    """The ``multigpu estimate`` parser."""
    p = Parser(
        prog=PROG,
        description="Memory per rank of a model's training state (parameters, gradients, "
        "optimizer state, communication buffers) under ddp, fsdp and fsdp+offload, whether it "
        "fits the devices found, and what strategy='auto' would choose. The model is built on "
        "the meta device: nothing is allocated. Activations are not included.",
    )
    p.add_argument(
        "target",
        help="digits, lm, path/to/train.py (the model it gives ctx.setup), pkg.module:factory "
        "or path/to/file.py:factory",
    )
    p.add_argument(
        "--nproc",
        type=processes_arg,
        help="processes per node (default: the GPUs found, else 1, as 'multigpu run')",
    )
    p.add_argument(
        "--nnodes", type=processes_arg, default=1, help="nodes (1); FSDP shards over all"
    )
    p.add_argument("--cpu", action="store_true", help="CPU processes even where GPUs exist")
    p.add_argument(
        "--optimizer",
        choices=sorted(STATES_PER_PARAM),
        help="(a script's own, given to ctx.setup; else adamw)",
    )
    p.add_argument("--precision", choices=PRECISIONS, default="32", help="(32)")
    p.add_argument(
        "--blocks",
        metavar="CLASS[,CLASS...]",
        help="FSDP's units: the model's modules of these class names, as "
        "FSDPStrategy(blocks=...) (default: FSDP's own choice)",
    )
    p.add_argument(
        "--min-block-params",
        type=processes_arg,
        default=DEFAULT_MIN_BLOCK_PARAMS,
        help="size from which FSDP makes a plain layer, or a child of a model without blocks, "
        f"a unit ({DEFAULT_MIN_BLOCK_PARAMS:,})",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def _load_file(where: str) -> Any:
    path = Path(where)
    if not path.is_file():
        raise UsageError(f"{where} does not exist; expected a Python file holding the factory")
    sys.path.insert(0, str(path.parent.resolve()))  # its own imports, as `python file` would
    try:
        return SimpleNamespace(**runpy.run_path(str(path), run_name=path.stem))
    except Exception as e:  # the user's file: which and why, in one line
        first = " ".join(str(e).split())[:200]
        raise UsageError(
            f"importing {where} raised {type(e).__name__}: {first}; fix the file, or keep its "
            "work under `if __name__ == '__main__':`"
        ) from e


def _factory(target: str) -> Callable[[], Any]:
    if target in BUILTIN:
        module_name, attr = BUILTIN[target]
        try:
            return getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            raise UsageError(
                f"the built-in model {target!r} is not available in this installation ({e}); "
                "expected digits, lm or pkg.module:factory"
            ) from e
    where, sep, attr = target.rpartition(":")
    if not sep or not where or not attr:
        raise UsageError(
            f"TARGET {target!r} is not a model; expected digits, lm, path/to/train.py (a "
            "script that calls ctx.setup(model, ...)), pkg.module:factory or "
            "path/to/file.py:factory (a callable that returns an nn.Module)"
        )
    if where.endswith(".py"):
        module = _load_file(where)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise UsageError(f"cannot import {where!r} ({e}); check the module name") from e
    found = getattr(module, attr, None)
    if not callable(found):
        raise UsageError(f"{where} has no callable {attr!r}; expected a function or class")
    return found


def build_model(target: str) -> tuple[nn.Module, torch.optim.Optimizer | None]:
    """TARGET's model, built on the meta device (nothing allocated), and the optimizer a
    script gave ``ctx.setup`` with it (None for a factory); a UsageError when TARGET cannot be
    found or does not make an ``nn.Module``."""
    if target.endswith(".py"):  # a training script: what it gives ctx.setup
        return model_of_script(target)
    make = _factory(target)
    try:
        with torch.device("meta"):
            model = make()
    except Exception as e:  # the user's factory: say which and why, in one line
        first = " ".join(str(e).split())[:200]
        raise UsageError(
            f"{target}() raised {type(e).__name__}: {first}; expected a callable that builds the "
            "model with no arguments (wrap it: def build(): return Net(...))"
        ) from e
    if not isinstance(model, nn.Module):
        raise UsageError(f"{target} returned a {type(model).__name__}; expected an nn.Module")
    return model, None


def block_classes(model: nn.Module, names: str | None) -> list[type[nn.Module]] | None:
    """The classes ``--blocks`` names (comma-separated class names of ``model``'s modules).

    Raises:
        UsageError: a name no module of the model has.
    """
    if names is None:
        return None
    found: dict[str, type[nn.Module]] = {}
    for module in model.modules():
        found.setdefault(type(module).__name__, type(module))
    wanted = [name.strip() for name in names.split(",") if name.strip()]
    missing = [name for name in wanted if name not in found]
    if missing or not wanted:
        known = ", ".join(list(found)[:8])
        raise UsageError(
            f"--blocks {names!r}: the model ({type(model).__name__}) has no module of class "
            f"{', '.join(missing) or '(none given)'}; expected class names of its modules, "
            f"e.g. {known}"
        )
    return [found[name] for name in wanted]


def devices(nproc: int | None, *, cpu: bool = False) -> tuple[int, Capacity, str]:
    """(processes on this node, what one rank has, the devices in words) on this machine.

    Raises:
        UsageError: more processes than GPUs on a GPU machine.
    """
    from multigpu.gpus import list_gpus

    gpus = [] if cpu else list_gpus()
    if gpus:
        n = nproc or len(gpus)
        capacity = gpus_capacity(gpus, n)
        if capacity is None:
            raise UsageError(
                f"--nproc {n} but this machine has {len(gpus)} GPU(s); expected at most "
                f"{len(gpus)} (one process per GPU); for several machines add --nnodes, for "
                "CPU processes --cpu"
            )
        return n, capacity, f"{len(gpus)} GPU(s), {n} used"
    n = nproc or 1
    return n, cpu_capacity(n), f"no GPU: {n} CPU process{'es' * (n > 1)}"


def estimate_main(argv: Sequence[str]) -> int:
    """Entry point of ``multigpu estimate``; 0, or a UsageError for the caller (exit 2)."""
    ns = build_parser().parse_args(list(argv))
    model, scripts_optimizer = build_model(ns.target)
    blocks = block_classes(model, ns.blocks)
    n, capacity, where = devices(ns.nproc, cpu=ns.cpu)
    est = estimate_memory(
        model,
        world_size=n * ns.nnodes,
        # --optimizer, else the script's own (what it gave ctx.setup), else AdamW.
        optimizer=ns.optimizer or scripts_optimizer or "adamw",
        precision=ns.precision,
        blocks=blocks,
        min_block_params=ns.min_block_params,
        capacity=capacity,
    )
    if ns.json:
        sys.stdout.write(json.dumps(_json(ns, model, est, where), indent=2) + "\n")
        return 0
    console = Console(
        soft_wrap=True, width=max(WIDTH, shutil.get_terminal_size().columns), highlight=False
    )
    nodes = f" x {ns.nnodes} nodes" if ns.nnodes > 1 else ""
    header = (
        f"{ns.target} ({type(model).__name__}, {est.parameters:,} parameters, "
        f"{size(est.param_bytes)}), {est.optimizer}, precision {est.precision}, "
        f"{n} process{'es' * (n > 1)}{nodes}; {where}"
    )
    console.print(rich_view(est, header=header))
    return 0


def _json(ns: argparse.Namespace, model: nn.Module, est: MemoryEstimate, where: str) -> Any:
    out = as_json(est)
    name, why = est.choose()
    out.update(
        target=ns.target,
        model=type(model).__name__,
        nproc=est.world_size // ns.nnodes,
        nnodes=ns.nnodes,
        devices=where,
        fits={s.strategy: est.fits(s.strategy) for s in est.strategies},
        auto=name,
        auto_reason=why,
    )
    return out

"""``multigpu estimate TARGET``: a model's memory per rank under each strategy, and what fits.

TARGET is a built-in job's model (``digits``, ``lm``) or ``pkg.module:factory`` /
``path/to/file.py:factory``, a callable returning an ``nn.Module``. The model is built on the meta
device: nothing is allocated, so a model far larger than this machine can be asked about. The
devices are those found here: the GPUs (NVML, then nvidia-smi), else this machine's RAM shared
by ``--nproc`` CPU processes (and any memory limit on this process).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import torch
from rich.console import Console
from rich.table import Table
from torch import nn

from multigpu.errors import UsageError
from multigpu.estimate import Capacity, choose, cpu_capacity, estimate_memory
from multigpu.estimate.capacity import GIB
from multigpu.estimate.memory import PRECISIONS, STATES_PER_PARAM

PROG = "multigpu estimate"
BUILTIN = {
    "digits": ("multigpu.examples.digits", "DigitsCNN"),
    "lm": ("multigpu.examples.lm", "build_model"),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message}; see '{PROG} --help'")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of processes >= 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``multigpu estimate`` parser."""
    p = _Parser(
        prog=PROG,
        allow_abbrev=False,
        description="Memory per rank of a model's training state (parameters, gradients, "
        "optimizer state, communication buffers) under ddp, fsdp and fsdp+offload, whether it "
        "fits the devices found, and what strategy='auto' would choose. The model is built on "
        "the meta device: nothing is allocated. Activations are not included.",
    )
    p.add_argument("target", help="digits, lm, pkg.module:factory or path/to/file.py:factory")
    p.add_argument(
        "--nproc",
        type=_positive,
        help="processes (ranks) sharing the work (default: the GPUs found, else 1)",
    )
    p.add_argument("--optimizer", choices=sorted(STATES_PER_PARAM), default="adamw", help="(adamw)")
    p.add_argument("--precision", choices=PRECISIONS, default="32", help="(32)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def _factory(target: str) -> Callable[[], Any]:
    if target in BUILTIN:
        module_name, attr = BUILTIN[target]
        return getattr(importlib.import_module(module_name), attr)
    where, sep, attr = target.rpartition(":")
    if not sep or not where or not attr:
        raise UsageError(
            f"TARGET {target!r} is not a model; expected digits, lm, pkg.module:factory or "
            "path/to/file.py:factory (a callable that returns an nn.Module)"
        )
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise UsageError(f"{where} does not exist; expected a Python file holding {attr}")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None  # a .py file always has one
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(path.parent.resolve()))  # its own imports, as `python file` would
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise UsageError(f"cannot import {where!r} ({e}); check the module name") from e
    found = getattr(module, attr, None)
    if not callable(found):
        raise UsageError(f"{where} has no callable {attr!r}; expected a function or class")
    return found


def build_model(target: str) -> nn.Module:
    """TARGET's model, built on the meta device (nothing allocated).

    Raises:
        UsageError: TARGET cannot be found, or does not make an ``nn.Module``.
    """
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
    return model


def devices(nproc: int | None) -> tuple[int, Capacity, str]:
    """(processes, what one rank has, the devices in words) on this machine."""
    from multigpu.gpus import list_gpus

    gpus = list_gpus()
    if gpus:
        n = nproc or len(gpus)
        used = gpus[:n] if n <= len(gpus) else gpus
        tightest = min(used, key=lambda g: g.memory_free_mib)
        where = f"{len(gpus)} GPU(s); the tightest of {min(n, len(gpus))}: {tightest.short()}"
        capacity = Capacity(
            bytes=tightest.memory_free_mib * 2**20,
            source=f"GPU {tightest.index}: {tightest.memory_free_mib / 1024:.1f} of "
            f"{tightest.memory_total_mib / 1024:.1f} GiB free",
        )
        return n, capacity, where
    n = nproc or 1
    return n, cpu_capacity(n), f"no GPU: {n} CPU process(es)"


def _gib(value: int) -> str:
    return f"{value / GIB:.2f} GiB" if value >= GIB / 100 else f"{value / 2**20:.1f} MiB"


def estimate_main(argv: Sequence[str]) -> int:
    """Entry point of ``multigpu estimate``; 0, or a UsageError for the caller (exit 2)."""
    ns = build_parser().parse_args(list(argv))
    model = build_model(ns.target)
    n, capacity, where = devices(ns.nproc)
    est = estimate_memory(model, world_size=n, optimizer=ns.optimizer, precision=ns.precision)
    chosen, why = choose(est, capacity) if n > 1 else ("single", "one process: nothing to split")
    on_gpu = not where.startswith("no GPU")
    fits = {
        s.strategy: (s.device <= capacity.bytes) if on_gpu or s.host == 0 else None
        for s in est.strategies
    }
    if ns.json:
        out = est.to_json()
        out.update(
            target=ns.target,
            model=type(model).__name__,
            devices=where,
            capacity={"bytes": capacity.bytes, "source": capacity.source},
            fits=fits,
            auto=chosen,
            auto_reason=why,
        )
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return 0
    console = Console(soft_wrap=True, width=max(100, shutil.get_terminal_size().columns))
    console.print(
        f"{ns.target} ({type(model).__name__}, {est.parameters:,} parameters, "
        f"{_gib(est.param_bytes)}), {est.optimizer}, precision {est.precision}, "
        f"{n} process(es); {where}",
        highlight=False,
    )
    table = Table(title="memory per rank for the training state")
    for column in ("strategy", "params", "grads", "optimizer", "buffers", "total", "on device"):
        table.add_column(column, justify="left" if column == "strategy" else "right")
    table.add_column("fits")
    for s in est.strategies:
        fit = fits[s.strategy]
        shown = "n/a (GPU only)" if fit is None else ("[green]yes[/]" if fit else "[red]no[/]")
        table.add_row(
            s.strategy,
            *(_gib(v) for v in (s.params, s.grads, s.optimizer, s.buffers, s.total, s.device)),
            shown,
        )
    console.print(table)
    console.print(f"one rank has {capacity}", highlight=False)
    console.print(f"strategy='auto' chooses {chosen}: {why}", highlight=False)
    console.print(
        "not included: activations (they grow with the batch and the sequence length) and "
        "the framework's own memory; buffers = DDP's gradient buckets, FSDP's gathered units",
        highlight=False,
    )
    return 0

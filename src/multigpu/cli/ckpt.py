"""``multigpu ckpt inspect PATH`` and ``multigpu ckpt convert SRC DST``.

Exit codes: 0 fine; 1 ``inspect`` found a checkpoint incomplete or corrupt; 2 bad input (one
line on stderr, nothing written).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from multigpu.checkpoint.convert import to_dcp, to_file
from multigpu.checkpoint.dispatch import summarize
from multigpu.checkpoint.hub_export import DEFAULT_MAX_SHARD_SIZE, export_hub
from multigpu.common.arguments import Parser
from multigpu.errors import CheckpointError, UsageError

PROG = "multigpu ckpt"


def build_parser() -> argparse.ArgumentParser:
    """The ``multigpu ckpt`` parser."""
    parser = Parser(prog=PROG, description="Look into and convert checkpoints.")
    sub = parser.add_subparsers(dest="action", required=True, metavar="{inspect,convert}")
    inspect = sub.add_parser(
        "inspect",
        help="tensors, step, world size, completeness and checksums of a checkpoint",
        description="Show what a checkpoint (file, step-* directory or directory of them) "
        "holds. Exit code 1 when it is incomplete or corrupt.",
    )
    inspect.add_argument("path")
    inspect.add_argument("--json", action="store_true", help="print one JSON object")
    inspect.add_argument("--trust", action="store_true", help="allow a legacy pickle (runs code)")
    convert = sub.add_parser(
        "convert",
        help="one plain state dict from any checkpoint (sharded too), or a sharded checkpoint "
        "from a plain state dict",
        description="SRC: a multigpu checkpoint (sharded by any number of ranks under any "
        "strategy), a plain DCP checkpoint directory (torch.distributed.checkpoint.save, "
        "torchtitan), safetensors weights (a file, or a directory with model.safetensors or "
        "its index), or a DataParallel/DDP/compiled/CUDA-saved state dict. --to file "
        "(default): its model as one plain state dict loadable with torch.load(..., "
        "weights_only=True) (DST ending in .safetensors: one safetensors file). --to dcp: as a "
        "sharded checkpoint directory that ctx.load and a Checkpointer resume on any world size "
        "and strategy. --to safetensors: DST becomes a Hugging Face model directory "
        "(model.safetensors, or model-0000N-of-0000M.safetensors and "
        "model.safetensors.index.json past --max-shard-size; config.json from --config), read "
        "one tensor at a time from a sharded SRC; with --config, the checkpoint must be its "
        "model's (names and shapes, else refused), tied weights written once and the names "
        "save_pretrained writes (the hub's own, where transformers 5 renamed the modules); "
        "without it, the checkpoint's names as they are.",
    )
    convert.add_argument("src")
    convert.add_argument("dst")
    convert.add_argument(
        "--to",
        choices=("file", "dcp", "safetensors"),
        default="file",
        help="what to write (default file)",
    )
    convert.add_argument("--key", help="the object or dict key holding the model in SRC")
    convert.add_argument("--name", help="--to dcp: the model's object name in DST (model)")
    convert.add_argument(
        "--config",
        metavar="PATH",
        help="--to safetensors: the model's config.json, copied to DST; with transformers, "
        "a checkpoint of another model or width is refused, its model's tied weights are "
        "written once and its names as save_pretrained writes them",
    )
    convert.add_argument(
        "--max-shard-size",
        metavar="SIZE",
        help=f"--to safetensors: the largest file (default {DEFAULT_MAX_SHARD_SIZE}; KB, MB, GB "
        "are powers of 1000, KiB, MiB, GiB of 1024)",
    )
    convert.add_argument("--trust", action="store_true", help="allow a legacy pickle (runs code)")
    convert.add_argument(
        "--force",
        action="store_true",
        help="overwrite DST (--to safetensors: write into the directory DST, replacing only the "
        "files it writes; a README or tokenizer files there stay)",
    )
    return parser


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def _print_summary(info: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    # Long lines and tensor names stay whole when piped (greppable); a terminal folds names.
    longest = max((len(row["name"]) for row in info["tensors"]), default=0)
    width = None if sys.stdout.isatty() else max(80, longest + 60)
    console = Console(soft_wrap=True, width=width)
    for entry in info.get("checkpoints", []):
        state = "complete" if entry["complete"] else "BROKEN: " + "; ".join(entry["problems"])
        console.print(f"{entry['name']}: {state}", highlight=False)
    table = Table(title=f"{info['path']} — {info['kind']}")
    pieces = any(row.get("pieces", 1) > 1 for row in info["tensors"])  # sharded when saved
    columns = ("tensor", "shape", "dtype", "bytes", "size") + (("pieces",) if pieces else ())
    for column in columns:
        numeric = column in ("bytes", "size", "pieces")
        table.add_column(column, justify="right" if numeric else "left", overflow="fold")
    for row in info["tensors"]:
        shape = "×".join(str(d) for d in row["shape"]) or "scalar"
        cells = [row["name"], shape, row["dtype"], f"{row['bytes']:,}", _size(row["bytes"])]
        table.add_row(*cells, *([str(row.get("pieces", 1))] if pieces else []))
    if info["tensors"]:
        console.print(table)
    lines = [f"{len(info['tensors'])} tensors, {info['total_numel']:,} values, "
             f"{_size(info['total_bytes'])}"]  # fmt: skip
    if "step" in info and info.get("world_size") is not None:
        epoch = f", epoch {info['epoch']}" if info.get("epoch") is not None else ""
        lines.append(
            f"step {info['step']}, saved by {info.get('world_size')} rank(s){epoch}, torch "
            f"{info.get('torch_version')}"
        )
    elif "step" in info:
        lines.append(f"step {info['step']}")
    if info.get("objects"):
        lines.append("objects: " + ", ".join(f"{n} ({k})" for n, k in info["objects"].items()))
    lines += _foreign_lines(info)
    lines += _layout_lines(info)
    if info.get("newest_complete"):
        lines.append(f"newest complete: {info['newest_complete']}")
    if info.get("devices_mapped"):
        lines.append("saved on " + ", ".join(sorted(info["devices_mapped"])) + ", loaded on cpu")
    if info.get("problems"):
        lines.append("BROKEN: " + "; ".join(info["problems"]))
    elif info.get("format_version") is not None:
        lines.append("complete: marker present, sizes and SHA-256 checksums match the manifest")
    elif "shards" in info:
        lines.append(
            "complete: every file the index names is there and long enough (DCP keeps no checksums)"
        )
    for line in lines:
        console.print(line, highlight=False)


def _foreign_lines(info: dict[str, Any]) -> list[str]:
    """What only checkpoints multigpu did not write say: the model a plain DCP checkpoint's
    conversion takes, an optimizer state dict's make-up, a hub directory's config."""
    lines = []
    if "model" in info:
        lines.append(
            f"model (what convert and load_weights read): {info['model']}"
            if info["model"]
            else "model: not one model state dict; convert and load_weights need --key NAME"
        )
    optimizer = info.get("optimizer")
    if optimizer:
        stats = ", ".join(f"{k} {n}" for k, n in optimizer["stats"].items()) or "no statistics"
        groups = "; ".join(
            f"{g['params']} params" + "".join(f", {k} {v}" for k, v in g.items() if k != "params")
            for g in optimizer["param_groups"]
        )
        lines.append(f"optimizer: {optimizer['params_with_state']} parameters with state ({stats})")
        lines.append(f"param groups ({len(optimizer['param_groups'])}): {groups}")
    config = info.get("config")
    if config:
        lines.append("config.json: " + ", ".join(f"{k} {v}" for k, v in config.items() if v))
    return lines


def _layout_lines(info: dict[str, Any]) -> list[str]:
    """How a format-2 checkpoint is laid out: the strategy, the sharded objects, the shards."""
    lines = []
    if info.get("format_version") == 1:
        lines.append("format 1 (before DCP): models and optimizers whole in state.pt")
    strategy = info.get("strategy") or {}
    if strategy.get("strategy"):
        mesh = strategy.get("mesh")
        shape = " on mesh " + ", ".join(f"{a}={n}" for a, n in mesh.items()) if mesh else ""
        origin = f" from {strategy['from']}" if strategy.get("from") else ""
        lines.append(f"saved under {strategy['strategy']}{shape}{origin}")
    units = strategy.get("units")
    if units:  # FSDP's fully_shard units, as FSDPStrategy.describe() recorded them
        lines.append(f"FSDP units ({len(units)}): {', '.join(str(u) for u in units)}")
    sharded = info.get("sharded") or {}
    if sharded:
        lines.append("sharded (DCP, reshards on load): " + ", ".join(
            f"{n} {s['tensors']} tensors{_stats(s)}, {_size(s['bytes'])}"
            if s["tensors"] else f"{n} {s['values']} values"
            for n, s in sharded.items()
        ))  # fmt: skip
    files = info.get("files") or {}
    shards = info.get("shards") or {n: {} for n in files if n.endswith(".distcp")}
    if shards:
        lines.append("shard files: " + "; ".join(
            f"{n} {_size(files.get(n, 0))}{_pieces(s)}" for n, s in shards.items()
        ))  # fmt: skip
    return lines


def _stats(summary: dict[str, Any]) -> str:
    stats = summary.get("stats") or {}
    return " (" + ", ".join(f"{k} {n}" for k, n in stats.items()) + ")" if stats else ""


def _pieces(shard: dict[str, Any]) -> str:
    objects = shard.get("objects") or {}
    return ": " + ", ".join(f"{n} {k}" for n, k in objects.items()) + " pieces" if objects else ""


def _inspect(ns: argparse.Namespace) -> int:
    info = summarize(ns.path, trust=ns.trust)
    if ns.json:
        print(json.dumps(info, indent=2))
    else:
        _print_summary(info)
    return 0 if info.get("complete", True) else 1


def _convert(ns: argparse.Namespace) -> int:
    dst = Path(ns.dst)
    hub_only = [o for o, v in (("--config", ns.config), ("--max-shard-size", ns.max_shard_size))
                if v is not None]  # fmt: skip
    if hub_only and ns.to != "safetensors":
        raise UsageError(
            f"{hub_only[0]} is an option of --to safetensors (a Hugging Face model directory); "
            f"drop it, or add --to safetensors"
        )
    if ns.to == "safetensors":
        if ns.name is not None:
            raise UsageError(
                f"--name {ns.name} names the model in a checkpoint written with --to dcp; a "
                "safetensors directory holds one model: drop --name"
            )
        said = export_hub(
            ns.src,
            dst,
            key=ns.key,
            config=ns.config,
            max_shard_size=ns.max_shard_size or DEFAULT_MAX_SHARD_SIZE,
            trust=ns.trust,
            force=ns.force,
        )
    elif ns.to == "dcp":
        name = ns.name or "model"
        saving = logging.getLogger("multigpu.checkpoint.native.saving")
        level = saving.level
        saving.setLevel(logging.WARNING)  # its "saved checkpoint" INFO line repeats ours
        try:
            said = to_dcp(ns.src, dst, key=ns.key, name=name, trust=ns.trust, force=ns.force)
        finally:
            saving.setLevel(level)
    elif ns.name is not None:
        raise UsageError(
            f"--name {ns.name} names the model in a checkpoint written with --to dcp; a plain "
            "file has no object names: drop --name, or add --to dcp"
        )
    else:
        said = to_file(ns.src, dst, key=ns.key, trust=ns.trust, force=ns.force)
    print(f"wrote {dst}: {said}")
    return 0


def ckpt_main(argv: Sequence[str]) -> int:
    """Entry point of ``multigpu ckpt``; returns the exit code (see the module doc).

    A checkpoint that cannot be read is bad input: a UsageError (exit code 2).
    """
    try:
        ns = build_parser().parse_args(list(argv))
        return _inspect(ns) if ns.action == "inspect" else _convert(ns)
    except CheckpointError as e:  # what was given cannot be read: bad input, as a usage error
        raise UsageError(str(e)) from e

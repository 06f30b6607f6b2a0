"""The tables of ``benchmarks/memory.py``, in Markdown (for benchmarks/RESULTS.md)."""

from __future__ import annotations

import os
import platform
import statistics
import sys
from typing import Any

GIB = 2**30
TITLES = {
    "ddp-torch": "hand-written DDP",
    "fsdp-torch": "hand-written fully_shard",
    "ddp": "multigpu ddp",
    "fsdp": "multigpu fsdp",
    "auto": "multigpu auto",
}
COUNTERPART = {"ddp": "ddp-torch", "fsdp": "fsdp-torch", "auto": "ddp-torch"}


def peak(ranks: list[dict[str, Any]]) -> float:
    """The larger rank's peak RSS growth, bytes."""
    return float(max(r.get("peak", 0) for r in ranks))


def step(ranks: list[dict[str, Any]], key: str = "step_s") -> float:
    values = [r[key] for r in ranks if key in r]
    return statistics.median(values) if values else float("nan")


def _median(runs: list[list[dict[str, Any]]], fn: Any) -> float:
    values = [fn(ranks) for ranks in runs]
    return statistics.median(values) if values else float("nan")


def _strategy(runs: list[list[dict[str, Any]]]) -> str:
    return ",".join(sorted({str(r.get("strategy", "-")) for ranks in runs for r in ranks}))


def _error(ranks: list[dict[str, Any]]) -> str:
    return next((str(r["error"]) for r in ranks if "error" in r), "")


def sizes_table(results: dict[str, Any]) -> list[str]:
    lines = [
        "| size | variant | strategy | peak RSS growth / rank | vs hand DDP | step (median) "
        "| vs hand DDP | vs hand-written same strategy | estimate | estimate error |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for size, by_variant in results["sizes"].items():
        est = results["estimates"][size]
        base = by_variant.get("ddp-torch", [])
        base_peak, base_step = _median(base, peak), _median(base, step)
        for variant, runs in by_variant.items():
            p, s = _median(runs, peak), _median(runs, step)
            name = _strategy(runs)
            guess = est["fsdp"] if name == "fsdp" else est["ddp"]
            other = by_variant.get(COUNTERPART.get(variant, ""), [])
            same = f"{s / _median(other, step):.3f}x" if other else "-"
            lines.append(
                f"| {size} ({est['parameters'] / 1e6:.1f}M) | {TITLES[variant]} | {name} "
                f"| {p / GIB:.2f} GiB | {p / base_peak:.2f}x | {s * 1e3:.0f} ms "
                f"| {s / base_step:.2f}x | {same} | {guess / GIB:.2f} GiB "
                f"| {100 * (guess / p - 1):+.1f} % |"
            )
    return lines


def paired_table(results: dict[str, Any]) -> list[str]:
    lines = [
        "| run | multigpu fsdp step | hand-written fully_shard step | ratio |",
        "|---|---|---|---|",
    ]
    ratios = []
    for i, ranks in enumerate(results["paired"], 1):
        if _error(ranks):
            lines.append(f"| {i} | failed: {_error(ranks)[:120]} | | |")
            continue
        mine, theirs = step(ranks), step(ranks, "step_torch_s")
        ratios.append(mine / theirs)
        ratio = mine / theirs
        lines.append(f"| {i} | {mine * 1e3:.0f} ms | {theirs * 1e3:.0f} ms | {ratio:.3f}x |")
    if ratios:
        lines.append(f"| median | | | **{statistics.median(ratios):.3f}x** |")
    return lines


def capped_table(results: dict[str, Any], cap: float) -> list[str]:
    lines = [
        f"| variant (RLIMIT_DATA {cap:g} GiB per process) | strategy | outcome "
        "| peak RSS growth / rank |",
        "|---|---|---|---|",
    ]
    for variant, ranks in results["capped"].items():
        error = _error(ranks)
        outcome = f"failed: `{error}`" if error else f"trained, step {step(ranks) * 1e3:.0f} ms"
        said = next((r["auto_line"] for r in ranks if "auto_line" in r), "")
        if said:
            outcome += f"; said: `{said}`"
        held = peak(ranks) / GIB
        lines.append(f"| {TITLES[variant]} | {_strategy([ranks])} | {outcome} | {held:.2f} GiB |")
    return lines


def allocator_table(results: dict[str, Any]) -> list[str]:
    lines = [
        "| size | variant | peak, glibc default | peak, M_MMAP_THRESHOLD=128K | estimate "
        "| error (128K) | step default | step 128K |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for size, by_variant in results["allocator"].items():
        for variant, ranks in by_variant.items():
            lines.append(_allocator_row(results, size, variant, ranks))
    return lines


def _allocator_row(results: dict[str, Any], size: str, variant: str, ranks: Any) -> str:
    est = results["estimates"][size]
    guess = est["fsdp"] if "fsdp" in variant else est["ddp"]
    default = results["sizes"].get(size, {}).get(variant, [])
    p = peak(ranks)
    return (
        f"| {size} | {TITLES[variant]} | {_median(default, peak) / GIB:.2f} GiB "
        f"| {p / GIB:.2f} GiB | {guess / GIB:.2f} GiB | {100 * (guess / p - 1):+.1f} % "
        f"| {_median(default, step) * 1e3:.0f} ms | {step(ranks) * 1e3:.0f} ms |"
    )


def limits_table(results: dict[str, Any], cap: float) -> list[str]:
    lines = [
        f"| limit ({cap:g} GiB) | VmData at start | VmSize at start | tensors allocated "
        "| how it ended |",
        "|---|---|---|---|---|",
    ]
    for kind, ranks in results["limits"].items():
        first = ranks[0]
        lines.append(
            f"| RLIMIT_{kind.upper()} | {first.get('data_before', 0) / GIB:.2f} GiB "
            f"| {first.get('size_before', 0) / GIB:.2f} GiB "
            f"| {first.get('filled', 0) / GIB:.2f} GiB | `{_error(ranks)[:160]}` |"
        )
    return lines


def markdown(results: dict[str, Any], args: Any) -> str:
    """Every table of the run, with the machine and the command."""
    import torch

    command = "python benchmarks/memory.py " + " ".join(sys.argv[1:])
    out = [
        f"`{command.strip()}` — {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"torch {torch.__version__}, 2 processes (gloo, 1 thread each), AdamW, 8 rows per rank, "
        f"{args.rounds} round(s) interleaved (medians), {args.steps} timed steps after 1.",
        "",
    ]
    if results["sizes"]:
        out += ["Peak RSS growth and step time, per rank:", "", *sizes_table(results), ""]
    if results["paired"]:
        out += ["Step time, taking turns in the same processes:", "", *paired_table(results), ""]
    if results["capped"]:
        out += ["Under a memory cap:", "", *capped_table(results, args.cap_gib), ""]
    if results["allocator"]:
        out += ["glibc keeping freed memory:", "", *allocator_table(results), ""]
    if results["limits"]:
        out += ["What a limit lets through:", "", *limits_table(results, args.cap_gib), ""]
    return "\n".join(out)

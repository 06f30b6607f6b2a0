"""Tables and verdicts of ``benchmarks/overhead.py``, as Markdown (pasteable into RESULTS.md).

Every ratio is a median of per-repetition ratios: repetition ``i`` of a contender against
repetition ``i`` of the baseline, measured next to each other in time, so slow drifts of the
machine's load cancel. ``[lo-hi]`` is the range of those ratios: the noise floor.

Environment variables read: none.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import measure

STEP_TARGET = 1.01
IMPORT_TARGET_S = 0.1
LAUNCH_TARGET_S = 0.5


def ratios(values: Sequence[float], base: Sequence[float]) -> list[float]:
    """Per-repetition ratios ``values[i] / base[i]``."""
    return [v / b for v, b in zip(values, base, strict=True)]


def spread(rs: Sequence[float]) -> str:
    """``1.004x [0.98-1.03]``: the median ratio and the range over repetitions."""
    return f"{statistics.median(rs):.3f}x [{min(rs):.2f}-{max(rs):.2f}]"


def header(data: dict[str, Any]) -> str:
    """Versions, machine and settings."""
    v = data["versions"]
    a = data["args"]
    return "\n".join(
        [
            f"command: {data['command']}",
            f"python {v['python']}, torch {v['torch']}, multigpu {v['multigpu']}, accelerate "
            f"{v['accelerate']}, lightning {v['lightning']}, numpy {v['numpy']}, "
            f"kernel {v.get('kernel', '?')}",
            f"{data['cpus']} CPUs, load average before: "
            + " ".join(f"{x:.2f}" for x in data["load_before"]),
            f"per-step: {a['reps']} interleaved reps x {a['steps']} steps ({a['warmup']} warm-up "
            f"not timed), global batch {a['batch']}, 2 processes x 1 thread, gloo, SGD",
        ]
    )


def step_table(model: str, runs: dict[str, list[dict[str, Any]]], args: Any) -> str:
    """The per-step table of one model, plus any run that was not 2 ranks x 1 thread on gloo."""
    base = [r["step_median_s"] for r in runs["ddp"]]
    base_loss = statistics.median(r["final_loss"] for r in runs["ddp"])
    lines = [
        "",
        f"### Per-step time, {model} ({_params(model)}), median of {args.reps} runs",
        "",
        f"| framework | command | ms/step | vs DDP [range] | CPU ms/step | CPU vs DDP [range] "
        f"| loss after {args.steps} steps | Δ loss vs DDP | launch → 1st step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    base_cpu = [r["cpu_median_s"] for r in runs["ddp"]]
    problems = []
    for job in measure.STEP_JOBS:
        rs = runs[job.key]
        step = [r["step_median_s"] for r in rs]
        cpu = [r["cpu_median_s"] for r in rs]
        losses = sorted({r["final_loss"] for r in rs})
        loss = statistics.median(r["final_loss"] for r in rs)
        loss_text = f"{loss:.8f}" + ("" if len(losses) == 1 else f" ({len(losses)} values)")
        launch = statistics.median(r["launch_s"] for r in rs)
        lines.append(
            f"| {job.title} | `{job.shown()}` | {statistics.median(step) * 1e3:.2f} "
            f"| {spread(ratios(step, base))} | {statistics.median(cpu) * 1e3:.2f} "
            f"| {spread(ratios(cpu, base_cpu))} | {loss_text} | {abs(loss - base_loss):.1e} "
            f"| {launch:.2f} s |"
        )
        for r in rs:
            if (r["world_size"], r["threads"], r["backend"]) != (2, 1, "gloo"):
                problems.append(
                    f"{job.key}: world size {r['world_size']}, {r['threads']} thread(s), "
                    f"backend {r['backend']} (expected 2, 1, gloo)"
                )
    lines += ["", "wrapped model: " + ", ".join(f"{k} {v[0]['wrapper']}" for k, v in runs.items())]
    lines += [f"NOT COMPARABLE: {p}" for p in sorted(set(problems))]
    return "\n".join(lines)


def quartiles(rs: Sequence[float]) -> str:
    """``1.004x [0.99-1.02]``: the median ratio and the middle half of the ratios."""
    q1, q2, q3 = statistics.quantiles(rs, n=4) if len(rs) > 1 else (rs[0],) * 3
    return f"{q2:.3f}x [{q1:.3f}-{q3:.3f}]"


PAIRED_PARTS = (
    ("ddp + ctx.loader", "(a) with multigpu's ctx.loader"),
    ("ddp + ctx.backward", "(a) with multigpu's ctx.backward"),
)
"""The side-by-side run's extra contenders: hand-written DDP with one piece of multigpu each."""


def paired_table(model: str, result: dict[str, Any]) -> str:
    """The side-by-side run of one model: each block against the DDP block of its round."""
    wall, cpu = result["block_step_s"], result["block_cpu_s"]
    thread = result.get("block_thread_s", {})
    losses = result["final_loss"]
    lines = [
        "",
        f"### Per-step time, {model}, in the same 2 processes taking turns "
        f"({result['rounds']} timed rounds of {result['block']} steps each)",
        "",
        "| framework | ms/step | vs DDP [quartiles] | CPU ms/step | CPU vs DDP [quartiles] "
        "| main thread CPU − DDP, µs/step [quartiles] "
        f"| loss after {result['steps']} steps | Δ loss vs DDP |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = [(job.key, job.title) for job in measure.STEP_JOBS] + list(PAIRED_PARTS)
    for k, title in rows:
        if k not in wall:  # a variant the side-by-side run does not have
            continue
        mine = (
            _us_quartiles([a - b for a, b in zip(thread[k], thread["ddp"], strict=True)])
            if k in thread
            else "-"
        )
        lines.append(
            f"| {title} | {statistics.median(wall[k]) * 1e3:.2f} "
            f"| {quartiles(ratios(wall[k], wall['ddp']))} | {statistics.median(cpu[k]) * 1e3:.2f} "
            f"| {quartiles(ratios(cpu[k], cpu['ddp']))} | {mine} | {losses[k]:.8f} "
            f"| {abs(losses[k] - losses['ddp']):.1e} |"
        )
    if (result["world_size"], result["threads"]) != (2, 1):
        lines.append(
            f"NOT COMPARABLE: world size {result['world_size']}, {result['threads']} threads"
        )
    return "\n".join(lines)


def _us_quartiles(diffs_s: Sequence[float]) -> str:
    """``+41 [-3..+95]``: median and middle half of per-round differences, in microseconds."""
    q1, q2, q3 = statistics.quantiles(diffs_s, n=4) if len(diffs_s) > 1 else (diffs_s[0],) * 3
    return f"{q2 * 1e6:+.0f} [{q1 * 1e6:+.0f}..{q3 * 1e6:+.0f}]"


def own_work_in_situ(result: dict[str, Any]) -> tuple[float, float] | None:
    """multigpu's extra main-thread CPU per step in the side-by-side run, and the DDP step's
    main-thread CPU (seconds), or None without those figures."""
    thread = result.get("block_thread_s", {})
    if "multigpu" not in thread:
        return None
    diffs = [a - b for a, b in zip(thread["multigpu"], thread["ddp"], strict=True)]
    return statistics.median(diffs), statistics.median(thread["ddp"])


def _params(model: str) -> str:
    return "3.16M parameters" if model == "mlp" else "38k parameters, 8x8 inputs"


def ddp_step_s(data: dict[str, Any], model: str) -> float | None:
    """The hand-written DDP step time of ``model`` in this run: side by side, else separate."""
    if model in data.get("paired", {}):
        return statistics.median(data["paired"][model]["block_step_s"]["ddp"])
    if model in data.get("step", {}):
        return statistics.median(r["step_median_s"] for r in data["step"][model]["ddp"])
    return None


def extra_table(extra: dict[str, dict[str, Any]], data: dict[str, Any]) -> str:
    """multigpu's own work per step, piece by piece, and its share of a DDP step."""
    lines = [
        "",
        "### Work multigpu adds per step, in a tight loop (one process, interleaved, median µs)",
        "",
        "| model | hand-written loader / batch | ctx.loader / batch | loss.backward() "
        "| ctx.backward(loss) | recorder entry | extra per step | share of a DDP step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model, result in extra.items():
        us, step = result["us"], ddp_step_s(data, model)
        share = (
            f"{result['total_us'] / (step * 1e6) * 100:.2f} % of {step * 1e3:.2f} ms"
            if step
            else "-"
        )
        lines.append(
            f"| {model} | {us['DataLoader + DistributedSampler']:.1f} | {us['ctx.loader']:.1f} "
            f"| {us['loss.backward()']:.1f} | {us['ctx.backward(loss)']:.1f} "
            f"| {us['recorder entry']:.1f} | {result['total_us']:.1f} µs | {share} |"
        )
    return "\n".join(lines)


def import_table(times: dict[str, list[tuple[float, float]]]) -> str:
    """Import time of each module in a fresh interpreter, against torch."""
    base = [t for t, _ in times["torch"]]
    lines = [
        "",
        f"### Time to import, fresh interpreter each, median of {len(base)} interleaved runs",
        "",
        "| module | import | vs torch | − torch | whole `python -c 'import …'` |",
        "|---|---|---|---|---|",
    ]
    for label, pairs in times.items():
        inside = [t for t, _ in pairs]
        diff = statistics.median(a - b for a, b in zip(inside, base, strict=True))
        lines.append(
            f"| `{label}` | {statistics.median(inside):.3f} s | {spread(ratios(inside, base))} "
            f"| {diff:+.3f} s | {statistics.median(w for _, w in pairs):.3f} s |"
        )
    return "\n".join(lines)


def launch_table(times: dict[str, dict[str, list[float]]]) -> str:
    """Launch to first step of each command, against torchrun + hand-written DDP."""
    base = times["torchrun"]
    lines = [
        "",
        f"### Launch to first optimizer step (rank 0), median of {len(base['launch_s'])} "
        "interleaved runs",
        "",
        "| command | launch → 1st step | − torchrun [range] | until rank 0 starts "
        "| rank 0 imports + set-up | CPU s, all processes | CPU − torchrun |",
        "|---|---|---|---|---|---|---|",
    ]
    for job in measure.LAUNCH_JOBS:
        t = times[job.key]
        diffs = [a - b for a, b in zip(t["launch_s"], base["launch_s"], strict=True)]
        cpu = [a - b for a, b in zip(t["cpu_total_s"], base["cpu_total_s"], strict=True)]
        lines.append(
            f"| `{job.shown()}` | {statistics.median(t['launch_s']):.2f} s "
            f"| {statistics.median(diffs):+.2f} s [{min(diffs):+.2f}..{max(diffs):+.2f}] "
            f"| {statistics.median(t['to_worker_s']):.2f} s "
            f"| {statistics.median(t['worker_setup_s']):.2f} s "
            f"| {statistics.median(t['cpu_total_s']):.2f} s | {statistics.median(cpu):+.2f} s |"
        )
    return "\n".join(lines)


def verdicts(data: dict[str, Any]) -> str:
    """One line per target: met or missed, with the figure."""
    lines = ["", "### Targets", ""]
    for model, runs in data.get("step", {}).items():
        base = [r["step_median_s"] for r in runs["ddp"]]
        for key in ("multigpu", "multigpu, no watchdog"):
            ratio = statistics.median(ratios([r["step_median_s"] for r in runs[key]], base))
            lines.append(
                f"- per-step overhead vs hand-written DDP, {model}, separate runs, {key}: "
                f"{(ratio - 1) * 100:+.1f} % "
                f"(target <= +1 %): {'met' if ratio <= STEP_TARGET else 'MISSED'}"
            )
    for model, result in data.get("paired", {}).items():
        wall = result["block_step_s"]
        ratio = statistics.median(ratios(wall["multigpu"], wall["ddp"]))
        lines.append(
            f"- per-step overhead vs hand-written DDP, {model}, same processes taking turns: "
            f"{(ratio - 1) * 100:+.1f} % (target <= +1 %): "
            f"{'met' if ratio <= STEP_TARGET else 'MISSED'}"
        )
    for model, result in data.get("paired", {}).items():
        found = own_work_in_situ(result)
        if found:
            extra, base = found
            share = extra / statistics.median(result["block_step_s"]["ddp"]) * 100
            lines.append(
                f"- multigpu's own work per step in place, {model}: {extra * 1e6:+.0f} µs of main "
                f"thread CPU (DDP step: {base * 1e3:.2f} ms of it) = {share:+.2f} % of the DDP "
                f"step's wall time (target <= 1 %): "
                f"{'met' if share <= (STEP_TARGET - 1) * 100 else 'MISSED'}"
            )
    for model, result in data.get("extra", {}).items():
        step = ddp_step_s(data, model)
        if step:
            share = result["total_us"] / (step * 1e6) * 100
            lines.append(
                f"- multigpu's own work per step in a tight loop, {model}: "
                f"{result['total_us']:.0f} µs = "
                f"{share:.2f} % of the DDP step (target <= 1 %): "
                f"{'met' if share <= (STEP_TARGET - 1) * 100 else 'MISSED'}"
            )
    if "import" in data:
        mg = [t for t, _ in data["import"]["multigpu"]]
        torch = [t for t, _ in data["import"]["torch"]]
        diff = statistics.median(a - b for a, b in zip(mg, torch, strict=True))
        lines.append(
            f"- import multigpu - import torch: {diff:+.3f} s (target <= +{IMPORT_TARGET_S} s): "
            f"{'met' if diff <= IMPORT_TARGET_S else 'MISSED'}"
        )
    if "launch" in data:
        runs = data["launch"]
        pairs = zip(runs["multigpu run"]["launch_s"], runs["torchrun"]["launch_s"], strict=True)
        diff = statistics.median(a - b for a, b in pairs)
        lines.append(
            f"- launch to first step, multigpu run - torchrun: {diff:+.2f} s (target <= "
            f"+{LAUNCH_TARGET_S} s): {'met' if diff <= LAUNCH_TARGET_S else 'MISSED'}"
        )
    lines.append("load average after: " + " ".join(f"{x:.2f}" for x in data.get("load_after", ())))
    return "\n".join(lines)

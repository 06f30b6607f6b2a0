"""Trace files: each rank's last collectives on disk, read by the launcher after a failure.

A worker that dies in native code — gloo aborting on a collective mismatch, a segfault, kill -9
— writes nothing at the end; its trace file, updated at the start and end of every collective,
still says what it was doing. The launcher lines the ranks' traces up by sequence number and
names the first collective where they disagree. (Pure Python: the launcher imports it.)
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

TRACE_SLOT = 384
"""Bytes per call in a trace file (one JSON line, space-padded)."""


def read_trace(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The calls kept in a trace file, oldest first (unreadable slots skipped)."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return []
    calls = []
    for start in range(0, len(data), TRACE_SLOT):
        text = data[start : start + TRACE_SLOT].strip(b"\0 \n")
        if text:
            try:
                calls.append(json.loads(text))
            except ValueError:
                continue  # a slot being rewritten when the process died
    return sorted(calls, key=lambda c: int(c.get("seq", 0)))


def describe(call: Mapping[str, Any]) -> str:
    """``all_reduce #12 float32[4] at train.py:40 in step()``, from a trace line or a report.

    Example:
        >>> describe({"op": "barrier", "seq": 3, "site": "a.py:1 in f()", "shapes": []})
        'barrier #3 at a.py:1 in f()'
    """
    shapes = ", ".join("[" + ", ".join(map(str, s)) + "]" for s in call.get("shapes") or [])
    what = f" {call.get('dtype', '')}{shapes}" if shapes else ""
    return f"{call['op']} #{call['seq']}{what} at {call['site']}"


def explain_traces(directory: str | os.PathLike[str]) -> list[str]:
    """Lines saying where each rank's last collective was, and where the ranks first disagree."""
    root = Path(directory)
    traces: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(root.glob("rank-*.trace")) if root.is_dir() else []:
        try:
            rank = int(path.stem.split("-", 1)[1])
        except ValueError:
            continue
        calls = read_trace(path)
        if calls:
            traces[rank] = calls
    if not traces:
        return []
    lines = ["multigpu: each rank's last collective:"]
    for rank, calls in sorted(traces.items()):
        last = calls[-1]
        if last.get("failed"):
            state = f"failed: {last['failed']}"
        else:
            state = "finished" if last.get("done") else "NOT finished"
        calls_in_all = f"{last['seq']} call" + ("" if int(last["seq"]) == 1 else "s")
        lines.append(f"  rank {rank}: {describe(last)} ({state}; {calls_in_all} in all)")
    by_seq = {r: {int(c["seq"]): c for c in calls} for r, calls in traces.items()}
    common = sorted(set.intersection(*(set(s) for s in by_seq.values())))
    for seq in common:
        kinds = {r: (s[seq]["op"], s[seq]["site"]) for r, s in by_seq.items()}
        if len(set(kinds.values())) > 1:
            detail = "; ".join(
                f"rank {r}: {op} at {site}" for r, (op, site) in sorted(kinds.items())
            )
            lines.append(
                f"  the ranks first disagree at collective #{seq} ({detail}): a collective that "
                "only some ranks run (e.g. inside `if rank == 0:`), or one a rank skipped"
            )
            break
    else:
        counts = {r: calls[-1]["seq"] for r, calls in traces.items()}
        if len(set(counts.values())) > 1:
            lines.append(
                "  the ranks made different numbers of collective calls ("
                + ", ".join(f"rank {r}: {n}" for r, n in sorted(counts.items()))
                + "): one skipped a collective or stopped early"
            )
    return lines

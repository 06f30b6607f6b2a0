"""What the benchmarks print and write, from hand-made results (no processes needed)."""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path
from typing import Any

import pytest

from multigpu.diagnostics.bench import comm, scaling_report
from multigpu.diagnostics.bench.scaling_report import write_plot


def _row(
    p: int, t: int, sps: float | None, speedup: float | None, error: str = ""
) -> dict[str, Any]:
    return {
        "processes": p,
        "threads": t,
        "samples_per_second": sps,
        "steps_per_second": None if sps is None else sps / 64,
        "step_ms": None if sps is None else 64_000 / sps,
        "samples_per_second_mean": sps,
        "timed_steps": 50 if sps else 0,
        "runs": [sps],
        "best": sps,
        "speedup": speedup,
        "efficiency": None if speedup is None else speedup / p,
        "error": error,
    }


DOC: dict[str, Any] = {
    "kind": "strong scaling",
    "target": "/home/u/train.py",
    "is_module": False,
    "script_args": ["--lr", "0.1"],
    "device": "cpu",
    "cores": 2,
    "torch": "2.13.0+cpu",
    "steps": 50,
    "warmup": 5,
    "repeats": 3,
    "samples_per_step": 64,
    "scaling": [_row(1, 1, 6000.0, 1.0), _row(2, 1, 9000.0, 1.5)],
    "splits": [_row(1, 2, 10000.0, 1.0), _row(2, 1, 9000.0, 0.9)],
    "recommendation": {"processes": 1, "threads": 2, "throughput": 10000.0, "cache": "/c.json"},
}


def test_scaling_report_names_speedup_efficiency_and_the_saved_split() -> None:
    out = io.StringIO()
    scaling_report.print_report(DOC, file=out)
    text = out.getvalue()
    assert text.startswith("bench scaling: /home/u/train.py --lr 0.1 on CPU (2 cores)")
    assert "strong scaling" in text and "global batch 64 samples" in text
    assert "1.50" in text and "75%" in text  # speed-up and efficiency of 2 processes
    assert (
        "fastest" in text and "fastest split: 1 process(es) x 2 thread(s), 10000 samples/s" in text
    )
    assert "saved to /c.json: `multigpu run --cpu auto`" in text


def test_a_failed_or_short_run_is_explained_in_its_row() -> None:
    doc = dict(DOC, splits=[_row(1, 2, None, None, "exit code 2: batch 64 not divisible by 3")])
    doc["scaling"] = [dict(_row(1, 1, 6000.0, 1.0), timed_steps=12)]
    out = io.StringIO()
    scaling_report.print_report(doc, file=out)
    assert "1x2: exit code 2: batch 64 not divisible by 3" in out.getvalue()
    assert "1x1: only 12 of 50 steps timed: the script ended sooner" in out.getvalue()


def test_csv_and_json_files(tmp_path: Path) -> None:
    files = scaling_report.write_files(DOC, tmp_path / "out")
    with open(files["csv"]) as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["table"], r["processes"], r["threads"]) for r in rows] == [
        ("scaling", "1", "1"),
        ("scaling", "2", "1"),
        ("splits", "1", "2"),
        ("splits", "2", "1"),
    ]
    assert float(rows[1]["efficiency"]) == 0.75
    assert Path(files["json"]).is_file()


@pytest.mark.requires("module:matplotlib")
def test_plot_is_a_small_png(tmp_path: Path) -> None:
    path = tmp_path / "scaling.png"
    assert write_plot(DOC, path) is True
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and 5_000 < len(data) < 100_000


def test_without_matplotlib_no_plot_and_no_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    assert write_plot(DOC, tmp_path / "scaling.png") is False
    assert not (tmp_path / "scaling.png").exists()


def test_comm_report_has_a_table_per_collective_and_the_gloo_note() -> None:
    rows = [
        {
            "op": op,
            "size_bytes": 1 << 20,
            "count": 1 << 18,
            "time_us": 1000.0,
            "algbw_gbps": 1.048576,
            "busbw_gbps": 1.048576 * f,
            "correct": op != "broadcast",
        }
        for op, f in (("all_reduce", 1.0), ("broadcast", 1.0), ("reduce_scatter", 0.5))
    ]
    doc = {
        "world_size": 2,
        "backend": "gloo",
        "device": "cpu",
        "dtype": "float32",
        "iters": 20,
        "warmup": 5,
        "torch": "2.13.0+cpu",
        "rows": rows,
        "notes": {"reduce_scatter": "gloo: an all-reduce of the whole input"},
    }
    out = io.StringIO()
    comm.print_report(doc, file=out)
    text = out.getvalue()
    assert "all_reduce  (busbw = algbw x 2(n-1)/n, n = 2)" in text
    assert "reduce_scatter  (busbw = algbw x (n-1)/n, n = 2)" in text
    assert "gloo: an all-reduce of the whole input" in text and "all_gather" not in text
    assert "WRONG" in text  # the broadcast row failed its check
    assert "peak busbw reduce_scatter: 0.524 GB/s at 1 MB" in text
    alone = io.StringIO()  # one GPU: nothing crosses a link (seen: "peak busbw 0.000 GB/s")
    comm.print_report(dict(doc, world_size=1), file=alone)
    assert "peak busbw" not in alone.getvalue() and "one process: nothing crossed a link" in (
        alone.getvalue()
    )
    assert "0.524" not in alone.getvalue()  # the busbw column shows "-"


def test_a_busy_machine_is_named_before_the_figures() -> None:
    quiet, busy = io.StringIO(), io.StringIO()
    scaling_report.print_report(dict(DOC, load_before=0.1), file=quiet)
    scaling_report.print_report(dict(DOC, load_before=3.2), file=busy)
    assert "load average" not in quiet.getvalue()
    assert "note: the load average was 3.2 when the benchmark started" in busy.getvalue()


def test_best_runs_column_and_a_recommendation_that_noise_decided() -> None:
    splits = [
        dict(_row(1, 2, 3000.0, 1.0), best=20000.0),
        dict(_row(2, 1, 6000.0, 2.0), best=9000.0),
    ]
    rec = {
        "processes": 2,
        "threads": 1,
        "throughput": 6000.0,
        "cache": None,
        "best_runs_favour": "1x2",
    }
    out = io.StringIO()
    scaling_report.print_report(dict(DOC, splits=splits, recommendation=rec), file=out)
    text = out.getvalue()
    assert "best run" in text and "20000" in text
    assert "but the fastest single runs favour 1x2 (20000 samples/s)" in text
    single = io.StringIO()
    scaling_report.print_report(dict(DOC, repeats=1), file=single)
    assert "best run" not in single.getvalue()

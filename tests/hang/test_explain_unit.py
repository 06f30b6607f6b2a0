"""``explain`` and ``explain_traces`` on recorded reports: the wording each hang gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from multigpu.instruments.hang.explain import explain
from multigpu.instruments.hang.recorder import CollectiveLog
from multigpu.instruments.hang.trace import explain_traces, read_trace


def _flight(op: str, seq: int, site: str) -> dict[str, object]:
    return {"op": op, "seq": seq, "site": site, "shapes": [], "dtype": "", "waited_s": 7.0}


def test_all_ranks_in_the_same_collective_but_one_missing() -> None:
    reports = {0: {"host": "a", "in_flight": _flight("all_reduce", 4, "t.py:3 in f()")}}
    lines = explain(reports, 2, 7.0)
    assert "rank 1: no report" in lines[2]
    assert "no report from rank 1: check that it is alive" in lines[-1]


def test_counts_that_differ_name_the_short_rank() -> None:
    reports = {
        0: {"in_flight": None, "where": "t.py:9 in g()", "site_counts": {"s": 3}},
        1: {"in_flight": _flight("s", 3, "t.py:2"), "site_counts": {"s": 2}},
    }
    text = "\n".join(explain(reports, 2, 7.0))
    assert "s ran 3 times on rank 0, 2 times on rank 1: rank 1 skipped it" in text
    assert "rank 0 is in no collective while rank 1 waits" in text


def _run(log: CollectiveLog, ops: list[str]) -> None:
    for op in ops:  # one call site for every rank, as in a real training loop
        with log.record(op):
            pass


def test_a_trace_file_keeps_the_last_calls_and_whether_they_finished(tmp_path: Path) -> None:
    log = CollectiveLog(size=4, trace_path=str(tmp_path / "rank-0.trace"))
    _run(log, ["all_reduce"] * 6)
    with log.record("barrier"):
        calls = read_trace(tmp_path / "rank-0.trace")
    assert [c["seq"] for c in calls] == [4, 5, 6, 7]  # a ring of 4 slots
    assert calls[-1]["op"] == "barrier" and not calls[-1]["done"] and calls[-2]["done"]
    _run(CollectiveLog(size=4, trace_path=str(tmp_path / "rank-1.trace")), ["all_reduce"] * 7)
    lines = explain_traces(tmp_path)
    assert "rank 0: barrier #7" in lines[1] and "(finished; 7 calls" in lines[1]
    assert "the ranks first disagree at collective #7" in lines[3]


def test_a_call_that_raised_is_reported_failed_not_finished(tmp_path: Path) -> None:
    log = CollectiveLog(size=4, trace_path=str(tmp_path / "rank-0.trace"))
    _run(log, ["all_reduce"] * 2)
    with pytest.raises(RuntimeError), log.record("barrier"):
        raise RuntimeError("Timed out waiting 10000ms for recv operation to complete")
    last = read_trace(tmp_path / "rank-0.trace")[-1]
    assert last["op"] == "barrier" and not last["done"] and last["failed"] == "RuntimeError"
    lines = explain_traces(tmp_path)
    assert "rank 0: barrier #3 at " in lines[1] and "(failed: RuntimeError; 3 calls" in lines[1]


def test_a_rank_with_one_call_is_counted_in_the_singular(tmp_path: Path) -> None:
    _run(CollectiveLog(size=4, trace_path=str(tmp_path / "rank-0.trace")), ["all_reduce"])
    _run(CollectiveLog(size=4, trace_path=str(tmp_path / "rank-1.trace")), ["all_reduce"] * 2)
    lines = explain_traces(tmp_path)
    assert lines[1].endswith("(finished; 1 call in all)"), lines
    assert lines[2].endswith("(finished; 2 calls in all)"), lines

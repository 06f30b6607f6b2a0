"""``CollectiveLog.record``: what one call leaves behind (log, counts, trace file), cheaply."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from multigpu.instruments.hang.recorder import CollectiveLog, user_site
from multigpu.instruments.hang.trace import TRACE_SLOT, read_trace


def test_a_call_is_numbered_placed_at_the_callers_line_and_counted(tmp_path: Path) -> None:
    log = CollectiveLog(size=8, trace_path=str(tmp_path / "rank-0.trace"))
    for _ in range(3):
        with log.record("all_reduce"):
            line = sys._getframe().f_lineno
    here = f"test_recorder_unit.py:{line - 1} in test_a_call_is_numbered_placed_at_the_callers"
    assert log.count == 3 and log.recent[-1].seq == 3 and log.in_flight is None
    assert log.recent[-1].site.startswith(here)
    assert log.snapshot()["site_counts"] == {f"all_reduce at {log.recent[-1].site}": 3}


def test_nested_and_background_calls_are_not_recorded() -> None:
    log = CollectiveLog()
    with log.record("all_gather_object"):
        with log.record("all_gather"):  # torch's own inner call
            pass
        assert log.in_flight is not None and log.in_flight.op == "all_gather_object"
    worker = threading.Thread(target=lambda: log.record("barrier").__enter__())
    worker.start()
    worker.join()
    assert [c.op for c in log.recent] == ["all_gather_object"]
    with log.record("barrier"):  # after the nested one ended, recording goes on
        pass
    assert [c.op for c in log.recent] == ["all_gather_object", "barrier"]


def test_the_trace_is_a_fixed_ring_whose_line_says_done_only_when_the_call_returned(
    tmp_path: Path,
) -> None:
    path = tmp_path / "rank-0.trace"
    log = CollectiveLog(size=4, trace_path=str(path))
    assert path.stat().st_size == 4 * TRACE_SLOT and read_trace(path) == []
    with log.record("broadcast"):
        (during,) = read_trace(path)
    (after,) = read_trace(path)
    assert during["op"] == after["op"] == "broadcast" and during["seq"] == 1
    assert during["done"] is False and after["done"] is True and after["failed"] is None
    assert path.stat().st_size == 4 * TRACE_SLOT  # rewritten in place, never grown


def test_an_unwritable_trace_path_turns_the_trace_off_not_the_training(tmp_path: Path) -> None:
    log = CollectiveLog(trace_path=str(tmp_path / "missing-dir" / "rank-0.trace"))
    with log.record("barrier"):
        pass
    assert log.count == 1


def test_user_site_of_no_frame() -> None:
    assert user_site(None) == "?"

"""The doctor's rows (statuses, one-line text, counts, exit code) and how they are printed."""

from __future__ import annotations

import io
import json

import pytest

from multigpu.diagnostics.doctor.checks import (
    STATUSES,
    Check,
    document,
    exit_code,
    fail,
    ok,
    print_json,
    print_table,
    skip,
    summary,
    warn,
)

ROWS = [
    ok("software", "torch", "2.13.0+cpu, CPU-only build"),
    warn("cpu", "/dev/shm", "64 MiB", "docker run --shm-size=8g"),
    fail("network", "GLOO_SOCKET_IFNAME", "no interface eth9 on vm", "unset it"),
    skip("gpu", "gpus", "no GPU found"),
]


def test_a_row_that_is_not_ok_must_say_the_fix_and_every_row_what_was_found() -> None:
    with pytest.raises(ValueError, match="without a fix"):
        Check(group="cpu", name="threads", status="WARN", value="4 threads on 2 cores")
    with pytest.raises(ValueError, match="without a fix"):
        fail("cpu", "threads", "x", "")
    with pytest.raises(ValueError, match="no value"):
        skip("gpu", "gpus", "")
    with pytest.raises(ValueError, match="status"):
        Check(group="cpu", name="threads", status="BAD", value="x")


def test_values_and_fixes_are_one_line_whatever_they_were_given() -> None:
    row = fail("process group", "all-reduce", "RuntimeError: a\n  b\tc", "fix\nit")
    assert row.value == "RuntimeError: a b c" and row.fix == "fix it"


def test_summary_counts_every_status_and_only_a_fail_fails() -> None:
    assert summary(ROWS) == {"OK": 1, "WARN": 1, "FAIL": 1, "SKIP": 1}
    assert list(summary([])) == list(STATUSES)
    assert exit_code(ROWS) == 1
    assert exit_code([r for r in ROWS if r.status != "FAIL"]) == 0


def test_a_row_survives_the_trip_through_json_to_another_rank() -> None:
    row = ok("gpu", "topology", "NV12 (NVLink) x1", pairs={"0-1": "NV12"})
    back = Check.from_dict(json.loads(json.dumps(row.as_dict())))
    assert back == row


def test_json_document_has_the_checks_the_counts_and_the_exit_code() -> None:
    out = io.StringIO()
    print_json(document(ROWS, host="vm"), out)
    doc = json.loads(out.getvalue())
    assert set(doc) == {"host", "mode", "world_size", "checks", "summary", "exit_code"}
    assert doc["host"] == "vm" and doc["mode"] == "single" and doc["world_size"] == 1
    assert doc["summary"] == {"OK": 1, "WARN": 1, "FAIL": 1, "SKIP": 1}
    assert doc["exit_code"] == 1
    assert [c["status"] for c in doc["checks"]] == ["OK", "WARN", "FAIL", "SKIP"]
    assert set(doc["checks"][0]) == {"group", "name", "status", "value", "fix", "where", "detail"}
    ranks = document(ROWS, host="n0", mode="ranks", world_size=2, ranks=[{"rank": 0}, {"rank": 1}])
    assert ranks["ranks"] == [{"rank": 0}, {"rank": 1}]


def test_table_shows_each_row_with_its_status_and_fix_and_the_verdict() -> None:
    out = io.StringIO()
    print_table(document(ROWS, host="vm"), out)
    text = out.getvalue()
    assert "multigpu doctor: vm (this machine)" in text
    for row in ROWS:
        line = next(ln for ln in text.splitlines() if f" {row.name} " in ln)
        assert row.status in line, line
    assert "docker run --shm-size=8g" in text and "no interface eth9 on vm" in text
    assert text.rstrip().endswith("1 OK, 1 WARN, 1 FAIL, 1 SKIP (FAIL: see the fixes above)")
    other = fail("cpu", "threads", "8 threads on 2 cores", "export OMP_NUM_THREADS=1")
    moved = Check.from_dict({**other.as_dict(), "where": "rank 1 (node1)"})
    out = io.StringIO()
    print_table(document([moved], host="node0", mode="ranks", world_size=2), out)
    assert "rank 1 (node1): threads" in out.getvalue()
    assert "node0 (2 ranks)" in out.getvalue()

"""A bad record under ``multigpu run --cpu 2``: one line naming the file and the line, exit 2 —
found by the rank that indexes that file, said by every rank (none waits in the exchange)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.data import record_workers
from tests.launch._util import run_multigpu

SCRIPT = """
import sys
import multigpu
from multigpu.data import RecordFiles

with multigpu.init() as ctx:
    loader = ctx.loader(RecordFiles(sys.argv[1]), batch_size=4)
    for batch in loader:
        pass
"""


def test_a_bad_record_ends_the_run_in_one_line_and_exit_2(tmp_path: Path) -> None:
    data = tmp_path / "data"
    record_workers.write_shards(data, 4, 5)
    with open(data / "part-001.jsonl", "a") as f:  # indexed by rank 1 of 2
        f.write('{"id": 99, "x": [1, 2\n')
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = run_multigpu(["run", "--cpu", "2", str(script), str(data)], tmp_path)
    assert done.returncode == 2, done.stderr
    last = done.stderr.rstrip().splitlines()[-1]
    assert re.fullmatch(
        r"multigpu: error: rank \d on \S+: DataError: data file \S+/part-001\.jsonl, line 6: "
        r"invalid JSON \(.*\); fix or "
        r"remove the record, or pass on_bad='skip' to leave bad records out \(they are "
        r"counted\) \(1 other rank stopped too\)",
        last,
    ), done.stderr
    assert "Traceback" not in done.stderr

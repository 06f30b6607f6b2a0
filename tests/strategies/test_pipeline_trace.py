"""A model torch.export cannot trace (data-dependent control flow) under strategy='pipeline':
one line naming the model and the user's line, exit code 2 (torch's own ending: 535 lines)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.launch._util import run_multigpu

SCRIPT = Path(__file__).parent / "scripts" / "pipeline_data_dependent.py"


def test_data_dependent_control_flow_is_refused_in_one_line(tmp_path: Path) -> None:
    done = run_multigpu(["run", "--cpu", "2", str(SCRIPT)], tmp_path)
    lines = [line for line in done.stderr.splitlines() if not line.startswith("multigpu: strat")]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and done.stdout == "", done.stderr
    # Every rank traces and fails alike; the line names whichever failed first (rank 1 once).
    assert re.match(r"multigpu: error: rank [01] on ", lines[0]), lines[0]
    assert "strategy='pipeline' cannot trace Model's forward as one graph" in lines[0]
    assert f"at {SCRIPT}:15 in forward: `if x.sum() > 0:" in lines[0]
    assert "make the branch static" in lines[0]

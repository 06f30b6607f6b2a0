"""What the workers of ``multigpu run`` print reaches the terminal whole, line by line."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from tests.launch._util import run_multigpu


def test_every_ranks_printed_lines_stay_whole(tmp_path: Path) -> None:
    script = tmp_path / "talk.py"
    script.write_text(
        textwrap.dedent(
            """
            import multigpu

            with multigpu.init() as ctx:
                ctx.barrier()
                for i in range(400):
                    ctx.print(f"line {i:03d}", all_ranks=True)
                    ctx.print("a", "b", sep="-", end="!\\n", all_ranks=True)
            """
        )
    )
    done = run_multigpu(["run", "--cpu", "2", str(script)], tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # Before, print() wrote the text and its newline apart: "[rank0] line 005[rank1] line 005".
    bad = [line for line in lines if not re.fullmatch(r"\[rank[01]\] (line \d{3}|a-b!)", line)]
    assert not bad, bad[:5]
    assert len(lines) == 2 * 2 * 400

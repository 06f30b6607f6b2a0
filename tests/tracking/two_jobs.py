"""Two jobs of one process logging into one directory: steps 1..6, then a job resumed from a
checkpoint of step 4 logging steps 5..9 (5 and 6 are in the run already). Imported by the
tests, or run as ``python two_jobs.py TRACKER DIR`` (W&B's service and its variables stay in
that process)."""

from __future__ import annotations

import sys
from pathlib import Path

import multigpu


def two_jobs(name: str, directory: Path) -> None:
    """Both jobs, each a Context of its own; ``accuracy`` at each job's last step."""
    for first, last in ((1, 6), (5, 9)):
        with multigpu.init(
            environ={}, log_to=name, log_dir=directory, config={"lr": 0.1, "batch_size": 64}
        ) as ctx:
            for step in range(first, last + 1):
                ctx.log({"loss": 1.0 / step}, step=step)
            ctx.log({"accuracy": 0.5}, step=last)


if __name__ == "__main__":
    two_jobs(sys.argv[1], Path(sys.argv[2]))

"""A second ``multigpu.init`` in the same workers of ``multigpu run`` (after a teardown) works.

torch names every new default process group ``0`` again; on the store the launcher's agent
keeps for the whole run, the second group read the first one's keys (gloo's closed addresses):
"Connection reset by peer" in most runs, or a hang of both ranks until the launcher's timeout.
"""

from __future__ import annotations

from pathlib import Path

from tests.launch._util import SCRIPTS, run_multigpu


def test_init_three_times_in_the_same_two_workers(tmp_path: Path) -> None:
    done = run_multigpu(
        ["run", "--cpu", "2", "--timeout", "30", str(SCRIPTS / "init_again.py")], tmp_path, 90
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = {line for line in done.stdout.splitlines() if " round " in line}
    assert lines == {
        f"rank {rank} round {r} {strategy} world 2"
        for rank in (0, 1)
        for r in range(3)
        for strategy in ("fsdp", "ddp")
    }, done.stdout

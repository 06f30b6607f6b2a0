"""A short chaos schedule for CI: seeded kills of replica groups end exact, or in one line.

Each seed's schedule (``tests/replicas/chaos.py``, named in the test id and printed on a failure)
runs ``scripts/loops.py`` under ``multigpu run --replicas 2 --cpu 1`` and is judged against the
uninterrupted run of the same script: ``exact`` or ``ended`` pass, ``OFF`` (a wrong result, or a
wrong number of writers, after exit code 0) fails. The seeds here cover the same group killed
twice, both groups at once (every group restarts: from checkpoints, or from the start), and a
worker killed while its Checkpointer writes; ``python benchmarks/replica_chaos.py`` runs the full
schedule (20 seeds, one node or two).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.replicas.chaos import draw, judge, run, uninterrupted

pytest.importorskip("torchft", reason="torchft (pip install multigpu[ft]) is not installed")

SEEDS = (3, 4, 1)  # twice(readme/step), both(readme/step), save(ckpt/step)


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, ...], dict]:
    """The uninterrupted run of each (shape, LR schedule, strategy) the seeds use."""
    root = tmp_path_factory.mktemp("references")
    found: dict[tuple[str, ...], dict[str, torch.Tensor]] = {}
    for seed in SEEDS:
        s = draw(seed)
        key = (s.shape, s.lr, s.strategy)
        if key not in found:
            found[key] = uninterrupted(*key, root / "-".join(key))
    return found


@pytest.mark.parametrize("seed", SEEDS, ids=lambda seed: str(draw(seed)))
def test_a_seeded_kill_schedule_ends_exact_or_in_one_line(
    seed: int, references: dict[tuple[str, ...], dict], tmp_path: Path
) -> None:
    schedule = draw(seed)
    out = tmp_path / "run"
    outcome = judge(
        run(schedule, out), references[(schedule.shape, schedule.lr, schedule.strategy)], out
    )
    assert outcome.verdict in ("exact", "ended"), (str(schedule), outcome.notes, outcome.err)
    if outcome.verdict == "exact":
        assert outcome.worst is not None and outcome.worst <= 1e-5

"""``multigpu verify`` end to end, continued: a failed run's one-line error, and the padded LM
at world sizes 1 and 2 and accumulation 1 and 4 (token-weighted vs per-micro-batch means).

A file of its own so that the test processes share the verify runs (each 5-9 s on 2 cores).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.diagnostics.test_verify_end_to_end import ROOT, verify

PADDED_LM = ROOT / "examples" / "padded_lm.py"


def test_a_failing_run_is_a_fail_with_its_one_line_error_and_stderr(tmp_path: Path) -> None:
    # Every rank raises (none waits in a collective for another: the cause is never a lost
    # peer); the launcher names the lowest rank of those with the same error.
    script = tmp_path / "boom.py"
    script.write_text(
        "import multigpu\n"
        "with multigpu.init() as ctx:\n"
        "    raise ValueError(f'boom: the script broke at world size {ctx.world_size}')\n"
    )
    done = verify([str(script), "--nproc", "2,1", "--steps", "2"], tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the run at world size 2 failed" in done.stdout
    assert "ValueError: boom: the script broke at world size 2" in done.stdout  # the tail
    (reason,) = [line for line in done.stdout.splitlines() if line.startswith("reason: ")]
    assert reason.startswith("reason: the run at world size 2 failed (exit code 1): rank 0 on ")
    assert reason.endswith(
        " failed: ValueError: boom: the script broke at world size 2 (1 other rank stopped too); "
        "fix it first (try it with 'multigpu run')"
    ), reason
    assert done.stdout.rstrip().splitlines()[-1] == "FAIL"


def test_padded_lm_passes_at_one_and_two_processes_and_accumulation_one_and_four(
    tmp_path: Path,
) -> None:
    argv = [str(PADDED_LM), "--nproc", "1,2", "--accumulation", "1,4", "--steps", "3", "--json"]
    done = verify(argv, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["verdict"] == "PASS" and result["accumulation"] == [1, 4]
    runs = [(r["world_size"], r["accumulation"], r["command"][-1]) for r in result["runs"]]
    assert runs == [(1, 1, "1"), (2, 1, "1"), (1, 4, "4"), (2, 4, "4")]
    # Measured: parameters within 2e-7, losses within 1e-7 (float32 rounding); the per-micro-
    # batch mean differs by ~1e-2 (the next test).
    for c in result["comparisons"]:
        assert c["ok"] and 0 < c["max_rel_diff"] <= 1e-5, c
        assert c["losses"]["compared"] == 3 and c["losses"]["max_rel_diff"] <= 1e-6
    assert result["reasons"] == [] and result["notes"] == []


def test_padded_lm_averaged_per_micro_batch_fails_naming_the_padding(tmp_path: Path) -> None:
    # One process is enough to compare accumulation steps (and the cheapest: three runs).
    argv = [str(PADDED_LM), "--naive", "--nproc", "1", "--accumulation", "1,4", "--steps", "3"]
    done = verify([*argv, "--json"], tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    result = json.loads(done.stdout)
    (c,) = result["comparisons"]
    assert (c["world_size"], c["accumulation"], c["reference_accumulation"]) == (1, 4, 1)
    assert c["max_rel_diff"] > 1e-3 and c["losses"]["first_differing_step"] == 1
    (reason,) = result["reasons"]  # it repeats itself: not nondeterminism
    assert reason.startswith(
        "ctx.backward got cross-entropy means over targets of which some are ignore_index"
    )
    assert "ctx.backward(F.cross_entropy(..., reduction='sum'), num_items=" in reason

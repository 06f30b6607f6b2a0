"""``multigpu verify`` across accumulation steps, with token-weighted losses, and its failed runs:
the command line, the records, the reasons and the report (no process started)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from rich.console import Console

import multigpu
from multigpu.cli.main import main
from multigpu.cli.verify import parse_verify_args
from multigpu.diagnostics.compare import Tolerance, compare_runs
from multigpu.diagnostics.diagnose import find_reasons, unexplained
from multigpu.diagnostics.records import RunRecord, load_run
from multigpu.diagnostics.report import RunOutcome, VerifyResult, render, to_json
from multigpu.diagnostics.verify import run_error, verify_argv
from tests.core import loss_workers as w

SCRIPT = str(Path(__file__).parent / "scripts" / "mlp.py")


def test_accumulation_is_verifys_own_option_and_reaches_the_script_as_accumulation_steps() -> None:
    opts = parse_verify_args([SCRIPT, "--accumulation", "4,1,4", "--accumulation-steps", "2"])
    assert opts is not None
    assert opts.accumulation == (4, 1)  # the first is the reference; repeats dropped
    assert opts.script_args == ("--accumulation-steps", "2")  # the script's own, passed on
    passed = ["--accumulation-steps", "2", "--accumulation-steps", "4"]  # the last one counts
    assert verify_argv(opts, 2, "cpu", 4)[-4:] == passed
    assert parse_verify_args([SCRIPT]).accumulation is None  # type: ignore[union-attr]
    alone = parse_verify_args([SCRIPT, "--nproc", "1", "--accumulation", "1,4"])
    assert alone is not None and alone.nproc == (1,)  # accumulation alone: one world size will do


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("4", "'4' names one number of accumulation steps; expected at least two different"),
        ("1,0", "'1,0' is not a list of accumulation steps; expected numbers >= 1"),
    ],
)
def test_bad_accumulation_is_one_line(
    value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["verify", "--accumulation", value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def _record(ws: int, acc: int | None, *, weight: float = 1.0, **rank: object) -> RunRecord:
    same = {"steps": 2, "losses": [1.0, 0.5], "loaders": [{}], **rank}
    ranks = [{"rank": r, "world_size": ws, **same} for r in range(ws)]
    params = {"fc.weight": torch.full((2, 3), weight)}
    return RunRecord(world_size=ws, ranks=ranks, params=params, accumulation=acc)


def test_runs_are_named_by_world_size_and_accumulation_in_the_table_and_json() -> None:
    tol = Tolerance(rtol=1e-4)
    ref = _record(1, 1)
    others = [_record(2, 1), _record(1, 4), _record(2, 4, weight=1.5)]
    comparisons = tuple(compare_runs(run, ref, tol) for run in others)
    outcomes = tuple(
        RunOutcome(world_size=r.world_size, returncode=0, seconds=1.0, command=("x",),
                   accumulation=r.accumulation)
        for r in [ref, *others]
    )  # fmt: skip
    result = VerifyResult(
        world_sizes=(1, 2),
        accumulation=(1, 4),
        device="cpu",
        steps_requested=2,
        tolerance=tol,
        deterministic=False,
        runs=outcomes,
        comparisons=comparisons,
    )
    assert result.expected_runs == 4 and not result.passed
    buf = io.StringIO()
    render(result, Console(file=buf, width=100, soft_wrap=True))
    text = buf.getvalue()
    assert "against world size 1, accumulation 1" in text
    # Three runs compared: one difference column each (the one judged), the table fits.
    assert "max rel" in text and "max abs" not in text and "L2 rel" not in text
    assert "world size 2, accumulation 4 vs world size 1, accumulation 1: optimizer" in text
    data = json.loads(json.dumps(to_json(result)))
    assert data["accumulation"] == [1, 4]
    assert [r["accumulation"] for r in data["runs"]] == [1, 1, 4, 4]
    assert [(c["accumulation"], c["ok"]) for c in data["comparisons"]] == [
        (1, True),
        (4, True),
        (4, False),
    ]
    assert all(c["reference_accumulation"] == 1 for c in data["comparisons"])


def test_a_script_that_ignores_accumulation_is_named_and_the_asked_difference_is_not() -> None:
    asked = [_record(1, k, loaders=[{"accumulation_steps": k}]) for k in (1, 4)]
    assert not any("accumulation" in r for r in find_reasons(asked, []))
    # An evaluation loader beside the training one keeps 1 step: the script still follows.
    with_eval = [
        _record(1, k, loaders=[{"accumulation_steps": k}, {"accumulation_steps": 1}])
        for k in (1, 4)
    ]
    assert not any("accumulation" in r for r in find_reasons(with_eval, []))
    ignored = [_record(1, k, loaders=[{"accumulation_steps": 1}]) for k in (1, 4)]
    (reason,) = find_reasons(ignored, [])
    assert reason.startswith(
        "the script does not follow --accumulation: its loaders' accumulation steps are 1 at "
        "world size 1, accumulation 4; verify passes --accumulation-steps K to the script"
    )


def test_a_mean_over_padded_targets_is_named_with_the_fix() -> None:
    counts = {"calls": 3, "ignored": 30, "targets": 100}
    runs = [_record(1, None, mean_over_ignored=counts), _record(2, None)]
    (reason,) = find_reasons(runs, [])
    assert reason.startswith(
        "ctx.backward got cross-entropy means over targets of which some are ignore_index "
        "(padding: 30% of them)"
    )
    assert "num_items=(labels != -100).sum()" in reason
    assert not find_reasons([_record(1, None, weighted_backward=3), _record(2, None)], [])
    assert "a loss averaged per micro-batch over a varying number of items" in unexplained([])
    weighted = [_record(1, None, weighted_backward=3), _record(2, None, weighted_backward=3)]
    line = unexplained([], weighted)  # every run gave num_items: not that cause
    assert "a loss averaged per micro-batch" not in line
    assert "losses averaged per micro-batch (num_items given)" in line


@pytest.mark.parametrize(
    ("reason", "stderr", "expected"),
    [
        (  # an exception on one rank: the launcher's line names it
            "multigpu: error: rank 1 on vm failed: ValueError: bad (1 other rank stopped too); "
            "its output is above",
            "",
            "rank 1 on vm failed: ValueError: bad (1 other rank stopped too)",
        ),
        (  # sys.exit("...") records no error: the worker's last line says why
            "multigpu: error: rank 0 on vm exited with code 1; its output is above",
            "boom\nmultigpu: error: rank 0 on vm exited with code 1; its output is above",
            "rank 0 on vm exited with code 1 (its last line: boom)",
        ),
        ("stopped after 5 s", "x\n(stopped after 5 s)", "stopped after 5 s"),
        ("", "Killed", "Killed"),
    ],
)
def test_a_failed_run_is_said_in_one_line(reason: str, stderr: str, expected: str) -> None:
    assert run_error(reason, stderr) == expected


def test_the_recorder_takes_the_weighted_step_loss_and_counts_means_over_padding(
    tmp_path: Path,
) -> None:
    environ = {
        "MULTIGPU_DEVICE": "cpu",
        "MULTIGPU_VERIFY_DIR": str(tmp_path),
        "MULTIGPU_VERIFY_STEPS": "100",
    }
    with multigpu.init(environ=environ) as ctx:
        net = w.model()
        model, opt = ctx.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        loader = ctx.loader(w.padded_data(), batch_size=w.GLOBAL_BATCH, accumulation_steps=2)
        weighted = []
        for weigh in (True, False):
            for x, y in loader:
                with ctx.accumulate(model):
                    logits = model(x)
                    if weigh:
                        ctx.backward(w.loss_sum(logits, y), num_items=w.items(y))
                    else:
                        ctx.backward(F.cross_entropy(logits.flatten(0, 1), y.flatten()))
                    if ctx.step(opt) and weigh:
                        weighted.append(ctx.step_loss)
    record = load_run(tmp_path, 1)
    assert record is not None and record.steps == 2 * w.STEPS
    assert record.losses[: w.STEPS] == weighted  # the step's mean per token, not a sum
    assert record.weighted_backward == 2 * w.STEPS  # two micro-batches a step
    ignored = record.mean_over_ignored
    assert ignored["calls"] == 2 * w.STEPS and ignored["targets"] == 2 * w.STEPS * 8 * w.LENGTH
    y = w.padded_data().tensors[1]
    assert ignored["ignored"] == int((y == -100).sum())

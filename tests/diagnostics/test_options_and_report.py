"""``multigpu verify``'s command line (bad input: exit 2, one line) and its output formats."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
import torch
from rich.console import Console

from multigpu.cli.main import main
from multigpu.cli.verify import parse_verify_args
from multigpu.diagnostics.compare import Tolerance, compare_runs
from multigpu.diagnostics.records import RunRecord
from multigpu.diagnostics.report import RunOutcome, VerifyResult, render, to_json
from multigpu.diagnostics.verify import child_env, verify_argv
from multigpu.errors import UsageError

SCRIPT = str(Path(__file__).parent / "scripts" / "mlp.py")


def test_no_script_is_the_builtin_job() -> None:
    opts = parse_verify_args([])
    assert opts is not None
    assert (opts.target, opts.is_module, opts.script_args) == (
        "multigpu.examples.digits",
        True,
        ("--progress", "off"),
    )
    assert (opts.nproc, opts.steps, opts.rtol, opts.atol) == ((1, 2), 50, None, 0.0)


def test_verify_options_are_taken_out_anywhere_and_the_rest_goes_to_the_script() -> None:
    opts = parse_verify_args(
        [
            SCRIPT,
            "--dropout",
            "0.5",
            "--nproc",
            "2,1,2",
            "--steps=7",
            "--json",
            "--",
            "--steps",
            "3",
        ]
    )
    assert opts is not None
    assert opts.target == SCRIPT and not opts.is_module
    assert opts.script_args == ("--dropout", "0.5", "--steps", "3")
    assert opts.nproc == (2, 1)  # the first is the reference; repeats dropped
    assert opts.steps == 7 and opts.as_json
    mod = parse_verify_args(["-m", "json.tool", "--indent", "2", "--rtol", "1e-3"])
    assert mod is not None
    assert (mod.target, mod.is_module, mod.script_args, mod.rtol) == (
        "json.tool",
        True,
        ("--indent", "2"),
        1e-3,
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nproc", "1"], "names one world size"),
        (["--nproc", "2,2"], "names one world size"),
        (["--nproc", "0,1"], "not a list of process counts"),
        (["--nproc", "1,x"], "not a list of process counts"),
        (["--steps", "0"], "expected an integer >= 1"),
        (["--rtol", "-1"], "expected a number >= 0"),
        (["--rtol", "nan"], "expected a number >= 0"),
        (["missing_script.py"], "script 'missing_script.py' does not exist"),
        (["/"], "script '/' is a directory; expected a Python file"),
        (["-m", "no_such_package_xyz.train"], "module 'no_such_package_xyz.train' was not found"),
        (["--epochs", "3"], "unknown option '--epochs' before the script"),
    ],
)
def test_bad_input_is_a_usage_error(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_verify_args(argv)


def test_cli_prints_one_line_and_exits_2_on_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "--nproc", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("multigpu: error: argument --nproc: '3' names one world size")


def test_gpu_world_sizes_are_checked_against_the_gpus_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One GPU leaves nothing to compare on GPUs: the fix is --cpu, not "world sizes up to 1"
    (what a 1-GPU machine was told)."""
    import multigpu.gpus
    from multigpu.diagnostics.options import device_for_runs

    for count, fix in ((1, "add --cpu to compare CPU processes"), (2, "use world sizes up to 2")):
        monkeypatch.setattr(multigpu.gpus, "list_gpus", lambda count=count: [object()] * count)
        with pytest.raises(
            UsageError, match=f"asks for 3 GPUs but this machine shows {count}.*{fix}"
        ):
            device_for_runs([1, 3], cpu=False)
        assert device_for_runs([1, 3], cpu=True) == "cpu"
    assert device_for_runs([1, 2], cpu=False) == "cuda"
    monkeypatch.setattr(multigpu.gpus, "list_gpus", lambda: [object()])  # one GPU
    assert device_for_runs([1, 2], cpu=False, given=False) == "cpu"  # the default sizes: CPUs
    monkeypatch.setattr(multigpu.gpus, "list_gpus", lambda: [])
    assert device_for_runs([1, 2], cpu=False) == "cpu"
    assert parse_verify_args([]).nproc == (1, 2) and not parse_verify_args([]).nproc_given
    assert parse_verify_args(["--nproc", "1,2"]).nproc_given


def test_help_is_exit_0_and_says_what_the_script_must_do(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["verify", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "same seed" in out and "GLOBAL batch" in out and "float32 1e-4" in out


def test_children_get_one_thread_and_the_probe() -> None:
    env = child_env({"KEEP": "1"}, Path("/r/ws2"), 9, device="cuda", deterministic=True)
    assert env["KEEP"] == "1"
    assert env["MULTIGPU_VERIFY_DIR"] == "/r/ws2" and env["MULTIGPU_VERIFY_STEPS"] == "9"
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "1"
    assert env["MULTIGPU_DETERMINISTIC"] == "1" and env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert "GLOO_SOCKET_IFNAME" not in env  # only for CPU runs
    opts = parse_verify_args(["-m", "json.tool", "--x"])
    assert opts is not None
    assert verify_argv(opts, 4, "cuda")[3:] == ["run", "--gpus", "4", "-m", "json.tool", "--x"]


def _result(moved: float) -> VerifyResult:
    def record(ws: int, w: float) -> RunRecord:
        ranks = [{"rank": 0, "world_size": ws, "steps": 2, "losses": [1.0, 0.5]}]
        return RunRecord(world_size=ws, ranks=ranks, params={"fc.weight": torch.full((2, 3), w)})

    tol = Tolerance(rtol=1e-4)
    comparison = compare_runs(record(2, 1.0 + moved), record(1, 1.0), tol)
    runs = tuple(
        RunOutcome(world_size=ws, returncode=0, seconds=1.0, command=("x",)) for ws in (1, 2)
    )
    return VerifyResult(
        world_sizes=(1, 2),
        device="cpu",
        steps_requested=2,
        tolerance=tol,
        deterministic=False,
        runs=runs,
        comparisons=(comparison,),
        reasons=("some reason",) if moved else (),
    )


def test_render_shows_the_table_and_ends_with_the_verdict() -> None:
    for moved, verdict in ((0.0, "PASS"), (0.5, "FAIL")):
        buf = io.StringIO()
        render(_result(moved), Console(file=buf, width=120, soft_wrap=True))
        text = buf.getvalue()
        assert "fc.weight" in text and "2×3" in text
        assert text.rstrip().splitlines()[-1] == verdict
    assert "reason: some reason" in text and "5.00e-01" in text


def test_json_has_per_tensor_diffs_steps_losses_reasons_and_verdict() -> None:
    data = json.loads(json.dumps(to_json(_result(0.5))))
    assert data["verdict"] == "FAIL" and data["world_sizes"] == [1, 2]
    (c,) = data["comparisons"]
    assert (c["world_size"], c["steps"], c["reference_steps"]) == (2, 2, 2)
    assert c["tensors"][0]["name"] == "fc.weight" and c["tensors"][0]["shape"] == [2, 3]
    assert math.isclose(c["max_rel_diff"], 0.5)
    assert c["losses"]["first_differing_step"] is None
    assert data["reasons"] == ["some reason"]


def test_a_large_model_shows_the_failing_and_worst_tensors_and_counts_the_rest() -> None:
    ref = {f"layer{i}.weight": torch.ones(2) for i in range(60)}
    run = {**ref, "layer59.weight": torch.full((2,), 2.0)}
    record = [{"rank": 0, "steps": 1, "losses": [1.0]}]
    tol = Tolerance(rtol=1e-4)
    comparison = compare_runs(
        RunRecord(world_size=2, ranks=record, params=run),
        RunRecord(world_size=1, ranks=record, params=ref),
        tol,
    )
    result = VerifyResult(
        world_sizes=(1, 2),
        device="cpu",
        steps_requested=1,
        tolerance=tol,
        deterministic=False,
        runs=(),
        comparisons=(comparison,),
    )
    buf = io.StringIO()
    render(result, Console(file=buf, width=120, soft_wrap=True))
    text = buf.getvalue()
    assert "layer59.weight" in text and "FAIL" in text
    assert text.count(".weight") == 40
    assert "20 more tensors within tolerance not shown" in " ".join(text.split())

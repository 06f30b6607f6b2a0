"""Gradient compression (DDP communication hooks) on real gloo processes.

- every compression trains, keeps the replicas bitwise equal, and changes the all-reduced
  gradient by no more than its number format allows (fp16 < bf16); PowerSGD sends a fraction of
  the elements, less at rank 1 than at rank 4; ``MULTIGPU_COMPRESSION`` turns it on through
  ``multigpu.init``;
- bad names and options are one-line usage errors (exit 2 from ``multigpu train``);
- ``multigpu verify``'s records of the job say which compression ran, and verify names it as the
  reason results differ between world sizes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from multigpu.common.choices import COMPRESSIONS
from multigpu.diagnostics.diagnose import find_reasons
from multigpu.diagnostics.records import RunRecord, load_run
from multigpu.errors import UsageError
from multigpu.examples.digits import build_parser, train
from multigpu.strategies import DDPStrategy, SingleDeviceStrategy, resolve_strategy
from multigpu.strategies.compression import parse_compression
from multigpu.testing import run_distributed
from tests.launch._util import run_multigpu
from tests.strategies.workers import RUNS, STEPS, compressed_training


@pytest.fixture(scope="module")
def trained() -> list[dict[str, Any]]:
    """Both ranks' reports of ``compressed_training`` (one 2-process run for every test)."""
    return run_distributed(compressed_training, world_size=2, timeout=120)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_every_compression_trains_and_keeps_the_replicas_equal(trained):
    rank0, rank1 = trained
    for label, _ in RUNS:
        a, b = rank0[label], rank1[label]
        # Each rank applies the same all-reduced gradient: the weights stay bitwise equal.
        assert torch.equal(a["params"], b["params"]), label
        assert a["losses"] == b["losses"] and len(a["losses"]) == STEPS
        assert a["losses"][-1] < 0.2 * a["losses"][0], (label, a["losses"])
        assert a["accuracy"] >= 0.97, (label, a["accuracy"])
    # Measured: none 0.136 after 60 steps, PowerSGD rank 1 0.166 (its approximation costs a bit).
    assert rank0["powersgd"]["losses"][-1] != rank0["none"]["losses"][-1]


def test_fp16_and_bf16_round_the_gradient_by_their_precision(trained):
    runs = trained[0]
    exact = runs["none"]["first_grad"]  # the same model, data and step: only the hook differs
    fp16, bf16 = (_rel(runs[k]["first_grad"], exact) for k in ("fp16", "bf16"))
    # Measured 2.8e-4 and 2.4e-3: each rank's half is rounded to 11 or 8 significant bits, then
    # the sum once more.
    assert 0 < fp16 <= 2**-10
    assert fp16 < bf16 <= 2**-7
    # PowerSGD all-reduces its first steps uncompressed (start_iter=2): exactly the mean.
    assert torch.equal(runs["powersgd"]["first_grad"], exact)


def test_powersgd_sends_a_fraction_of_the_gradient_elements(trained):
    runs = trained[0]
    compressed_steps = STEPS - 2
    numel = runs["none"]["numel"]  # 2372: weights 64x32 and 4x64, biases 64 and 4
    rate1, before1, after1 = runs["powersgd"]["stats"]
    _, before4, after4 = runs["powersgd r4"]["stats"]
    assert before1 == before4 == numel * compressed_steps
    # Rank 1: P and Q of each weight, (64 + 32) + (4 + 64), plus the biases, per step.
    assert after1 == (96 + 68 + 68) * compressed_steps and rate1 > 10
    # Rank 4: (64 + 32) x 4; the 4x64 weight is not worth compressing at rank 4 (sent whole).
    assert after4 == (384 + 256 + 68) * compressed_steps
    assert after1 < after4 < before4


def test_the_environment_variable_compresses_through_init(trained):
    runs = trained[0]
    assert runs["env_strategy"]["compression"] == "fp16"
    assert torch.equal(runs["fp16 (env)"]["first_grad"], runs["fp16"]["first_grad"])
    assert torch.equal(runs["fp16 (env)"]["params"], runs["fp16"]["params"])


def test_a_hook_torch_refuses_is_a_usage_error_at_setup(trained):
    # torch registers its bf16 hook only on builds with CUDA and NCCL >= 2.10 (or XPU); on gloo
    # multigpu runs the same hook under another name, so only the NCCL choice can meet this.
    message = trained[0]["nccl_bf16_error"]
    if torch.version.cuda is not None:
        pytest.skip("a CUDA build of torch accepts its bf16 hook")
    assert message is not None and "\n" not in message
    assert message.startswith("compression='bf16' cannot run on backend nccl with this torch")
    assert "NCCL 2.10+" in message and "use another compression (fp16 or powersgd)" in message


def test_names_are_parsed_and_bad_ones_list_the_choices():
    assert [parse_compression(v) for v in (None, "", " FP16 ", "PowerSGD")] == [
        "none",
        "none",
        "fp16",
        "powersgd",
    ]
    with pytest.raises(UsageError) as info:
        parse_compression("gzip", given_as="MULTIGPU_COMPRESSION")
    message = str(info.value)
    assert "MULTIGPU_COMPRESSION='gzip'" in message and "\n" not in message
    assert all(name in message for name in COMPRESSIONS)
    with pytest.raises(UsageError, match="compression='int8'"):
        DDPStrategy(compression="int8")
    with pytest.raises(UsageError, match="powersgd_rank=0"):
        DDPStrategy(compression="powersgd", powersgd_rank=0)
    with pytest.raises(UsageError, match="powersgd_start_iter=1; expected an integer >= 2"):
        DDPStrategy(compression="powersgd", powersgd_start_iter=1)


def test_resolve_strategy_reads_the_variable_for_ddp_only():
    env = {"MULTIGPU_COMPRESSION": "bf16"}
    assert resolve_strategy("auto", 2, env).describe()["compression"] == "bf16"
    assert resolve_strategy("ddp", 2, {}).describe()["compression"] == "none"
    assert isinstance(resolve_strategy("auto", 1, env), SingleDeviceStrategy)  # nothing to send
    # Code that chose a compression (or none) keeps it; code that did not gets the variable.
    assert resolve_strategy(DDPStrategy(compression="none"), 2, env).describe()["compression"] == (
        "none"
    )
    assert resolve_strategy(DDPStrategy(), 2, env).describe()["compression"] == "bf16"
    described = resolve_strategy(DDPStrategy(compression="powersgd", powersgd_rank=2), 2, {})
    assert described.describe()["powersgd_rank"] == 2
    with pytest.raises(UsageError, match="MULTIGPU_COMPRESSION='fp8'"):
        resolve_strategy("single", 1, {"MULTIGPU_COMPRESSION": "fp8"})  # checked whatever runs


def test_compression_without_ddp_is_refused_by_the_job():
    args = build_parser().parse_args(["--strategy", "single", "--compression", "fp16"])
    with pytest.raises(UsageError, match="--compression fp16 compresses DDP's gradient"):
        train(args)  # refused before anything starts


def test_train_with_an_unknown_compression_exits_2(tmp_path: Path):
    done = run_multigpu(["train", "--compression", "foo", "--out", str(tmp_path / "o")], tmp_path)
    assert done.returncode == 2, done.stderr
    assert "argument --compression: invalid choice: 'foo'" in done.stderr
    assert "'none', 'bf16', 'fp16', 'powersgd'" in done.stderr
    assert not (tmp_path / "o").exists()


def test_verify_records_of_the_job_name_compression_as_the_reason(tmp_path: Path):
    # What `multigpu verify` runs at world size 2, with its records switched on (a whole verify
    # costs three launches: world sizes 1, 2 and 1 again); the reference is made by hand.
    records = tmp_path / "ws2"
    argv = ["run", "--cpu", "2", "-m", "multigpu.examples.digits", "--progress", "off",
            "--compression", "bf16"]  # fmt: skip
    done = run_multigpu(argv, tmp_path, MULTIGPU_VERIFY_DIR=str(records), MULTIGPU_VERIFY_STEPS="3")
    assert done.returncode == 0, done.stderr
    assert "gradient compression bf16" in done.stdout
    two = load_run(records, 2)
    assert two is not None and two.steps == 3
    assert [rank["compression"] for rank in two.ranks] == ["bf16", "bf16"]
    one = RunRecord(world_size=1, ranks=[{**two.main, "world_size": 1, "compression": "none"}])
    reasons = find_reasons([one, two], [])
    assert reasons[0].startswith(
        "gradient compression (none at world size 1, bf16 at world size 2)"
    )


def test_find_reasons_names_compression_only_when_used():
    def run(world_size: int, compression: str | None) -> RunRecord:
        rank = {"loaders": [{}], **({"compression": compression} if compression else {})}
        return RunRecord(world_size=world_size, ranks=[rank])

    plain = find_reasons([run(1, None), run(2, "none")], [])
    assert not any("compression" in r for r in plain)
    (reason,) = find_reasons([run(1, "none"), run(2, "powersgd")], [])
    assert reason.startswith("gradient compression (none at world size 1, powersgd at world")
    assert "--compression none" in reason and "MULTIGPU_COMPRESSION" in reason


def test_os_environ_is_the_default_source(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MULTIGPU_COMPRESSION", "powersgd")
    assert resolve_strategy("auto", 2).describe()["compression"] == "powersgd"

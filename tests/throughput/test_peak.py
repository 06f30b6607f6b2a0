"""The peak-FLOP/s table, MFU and FLOPs per token, and the --profile window: no processes."""

from __future__ import annotations

import pytest

from multigpu.common.arguments import profile_arg
from multigpu.common.profile_window import parse_window
from multigpu.common.variables import check_environment
from multigpu.errors import UsageError
from multigpu.session.initialize import init
from multigpu.throughput import find_peak, flops_per_token, mfu, peak_flops


@pytest.mark.parametrize(
    ("name", "table"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA A10G", "A10"),
        ("NVIDIA A10", "A10"),
        ("Tesla V100-SXM2-32GB", "V100 SXM2"),
        ("Tesla V100-PCIE-16GB", "V100 PCIe"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("NVIDIA GeForce RTX 3090", "RTX 3090"),
        ("AMD Instinct MI250X", "MI250X"),
        ("AMD Instinct MI300X", "MI300X"),
    ],
)
def test_device_names_as_torch_gives_them_find_their_row(name: str, table: str) -> None:
    found = find_peak(name)
    assert found is not None and found.name == table


def test_unknown_devices_have_no_row() -> None:
    assert find_peak("NVIDIA L40") is None and find_peak("Quadro P400") is None


def test_the_precision_picks_the_number_format() -> None:
    h100, v100 = find_peak("NVIDIA H100 80GB HBM3"), find_peak("Tesla V100-SXM2-16GB")
    assert h100 is not None and v100 is not None
    assert peak_flops(h100, "bf16-mixed", tf32_allowed=False) == pytest.approx(989.4e12)
    assert peak_flops(h100, "16-mixed", tf32_allowed=False) == pytest.approx(989.4e12)
    assert peak_flops(h100, "32", tf32_allowed=True) == pytest.approx(494.7e12)
    assert peak_flops(h100, "32", tf32_allowed=False) == pytest.approx(67e12)
    # a V100 has float16 tensor cores but neither bfloat16 nor TF32: those run at FP32's rate
    assert peak_flops(v100, "16-mixed", tf32_allowed=False) == pytest.approx(125e12)
    assert peak_flops(v100, "bf16-mixed", tf32_allowed=False) == pytest.approx(15.7e12)
    assert peak_flops(v100, "32", tf32_allowed=True) == pytest.approx(15.7e12)


def test_mfu_is_model_flops_over_the_devices_peak() -> None:
    # nanoGPT's 124M-parameter GPT-2 (12 layers, 768 wide, context 1024)
    per_token = flops_per_token(124_000_000, layers=12, width=768, seq_len=1024)
    assert per_token == 6 * 124e6 + 12 * 12 * 768 * 1024
    # 8 A100s at 312 TFLOP/s each, 1M tokens/s: 0.342 of their peak
    assert mfu(1e6, per_token, 312e12, 8) == pytest.approx(1e6 * per_token / (8 * 312e12))
    assert flops_per_token(1000, layers=12) == 6000  # no width or length: no attention term


@pytest.mark.parametrize(
    ("text", "why"),
    [("5:3", "the first step is after the last"), ("0:2", "steps count from 1"),
     ("x", "not two step numbers"), ("3", "not two step numbers"), ("-1:2", "not two step")],
)  # fmt: skip
def test_bad_windows_say_why_everywhere(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=f"^--profile {text}: {why}.*e.g. --profile 3:5$"):
        parse_window(text)
    with pytest.raises(Exception, match=f"--profile {text}: {why}"):
        profile_arg(text)
    with pytest.raises(UsageError, match=f"^MULTIGPU_PROFILE='{text}' .* FIRST:LAST.*\\({why}"):
        check_environment({"MULTIGPU_PROFILE": text})
    with pytest.raises(UsageError, match=f"^init\\(profile='{text}'\\): {why}"):
        init(profile=text, environ={})
    assert parse_window("3:5") == (3, 5) and parse_window(" 2:2 ") == (2, 2)


def test_a_profile_dir_that_cannot_be_written_is_refused_by_init(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    said = f"^profile directory {blocker}/traces: cannot write there \\(Not a directory\\); "
    with pytest.raises(UsageError, match=said + ".*MULTIGPU_PROFILE_DIR$"):
        init(profile="3:5", profile_dir=blocker / "traces", environ={})
    with pytest.raises(UsageError, match=said):
        init(environ={"MULTIGPU_PROFILE": "3:5", "MULTIGPU_PROFILE_DIR": str(blocker / "traces")})
    init(profile_dir=blocker / "traces", environ={}).teardown()  # no window: never written


def test_the_profile_window_counts_the_steps_of_the_readmes_loop(
    tmp_path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    # optimizer.step() by the script itself, no ctx.step: the window never opened.
    import torch

    monkeypatch.setenv("KINETO_LOG_LEVEL", "6")  # the profiler sets it (kept: undone after)

    with init(profile="2:3", profile_dir=tmp_path / "traces", environ={}) as ctx:
        model = torch.nn.Linear(4, 1)
        model, optimizer = ctx.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
        for _ in range(4):
            optimizer.zero_grad()
            ctx.backward(model(torch.ones(2, 4)).sum())
            optimizer.step()
    assert (tmp_path / "traces" / "rank0.json").is_file()
    assert "profile: optimizer steps 2-3 traced to " in capsys.readouterr().out

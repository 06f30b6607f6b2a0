"""Choosing GPUs: idle ones for auto, most free memory for N, exact indices, locked exclusions."""

from __future__ import annotations

import logging

import pytest

from multigpu.errors import UsageError
from multigpu.gpus import parse_gpu_request, select_gpus
from multigpu.gpus.visible import visible_devices

from .recorded import inventory

A100 = visible_devices(inventory("a100x8"), {})
TWO = visible_devices(inventory("two_busy"), {})


def picked(gpus, text: str, **kw) -> list[int]:
    return [g.index for g in select_gpus(gpus, parse_gpu_request(text), **kw)]


def test_auto_skips_busy() -> None:
    # 1, 2 (util 87/91%) and 4 (util 100%, 8% free) are busy; 7 (12%) is idle.
    assert picked(A100, "auto") == [0, 3, 5, 6, 7]
    assert picked(TWO, "auto") == [0]
    assert picked(A100, "auto", busy_utilization=95) == [0, 1, 2, 3, 5, 6, 7]
    assert picked(A100, "auto", busy_if_processes=True) == [0, 3, 5, 6]


def test_count_takes_most_free_memory_in_logical_order() -> None:
    assert picked(A100, "2") == [0, 3]  # equal free memory: lowest index first
    assert picked(A100, "5") == [0, 3, 5, 6, 7]
    # 6 needs one busy GPU: the one with the most free memory among the busy (1 and 2 tie).
    assert picked(A100, "6") == [0, 1, 3, 5, 6, 7]
    reordered = visible_devices(inventory("a100x8"), {"CUDA_VISIBLE_DEVICES": "7,5,4"})
    assert [g.logical_index for g in select_gpus(reordered, parse_gpu_request("2"))] == [0, 1]


def test_count_uses_busy_only_when_needed(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="multigpu.gpus"):
        assert picked(TWO, "1") == [0]
        assert not caplog.records
        assert picked(TWO, "2") == [0, 1]
    assert "looks busy (util 98%, 1261/24576 MiB free)" in caplog.text


def test_indices_exactly_in_given_order(caplog: pytest.LogCaptureFixture) -> None:
    assert picked(A100, "5,0") == [5, 0]
    with caplog.at_level(logging.WARNING, logger="multigpu.gpus"):
        assert picked(A100, "4,") == [4]  # busy, but asked for by name: used, with a warning
    assert "GPU 4: NVIDIA A100-SXM4-80GB looks busy" in caplog.text
    hidden = visible_devices(inventory("a100x8"), {"CUDA_VISIBLE_DEVICES": "6,3"})
    assert picked(hidden, "1,") == [3]  # logical index 1 is physical GPU 3


def test_missing_index_names_what_exists() -> None:
    with pytest.raises(UsageError) as e:
        select_gpus(TWO, parse_gpu_request("0,3"))
    msg = str(e.value)
    assert "GPU index 3" in msg and "2 GPU(s) (0: NVIDIA GeForce RTX 3090, 1: NVIDIA" in msg
    assert "--cpu N" in msg


def test_too_many_names_what_exists() -> None:
    with pytest.raises(UsageError) as e:
        select_gpus(TWO, parse_gpu_request("3"))
    assert str(e.value).startswith(
        "--gpus 3 asks for 3 GPUs but this machine has 2 (0: NVIDIA GeForce RTX 3090, 1: NVIDIA"
    )
    assert "use --gpus 2 or fewer, or --cpu N" in str(e.value)


@pytest.mark.parametrize("text", ["auto", "1", "0,"])
def test_no_gpu_suggests_cpu(text: str) -> None:
    with pytest.raises(UsageError, match="shows none.*--cpu N"):
        select_gpus([], parse_gpu_request(text))


def test_auto_with_everything_busy() -> None:
    only_busy = [g for g in TWO if g.index == 1]
    with pytest.raises(UsageError, match=r"no idle GPU among 1 \(1: .*util 98%"):
        select_gpus(only_busy, parse_gpu_request("auto"))


def test_exclude_locked() -> None:
    assert picked(A100, "auto", exclude={0, 5}) == [3, 6, 7]
    assert picked(A100, "2", exclude={0}) == [3, 5]
    assert picked(TWO, "1", exclude={TWO[0].uuid}) == [1]  # by UUID (MIG instances)
    with pytest.raises(UsageError, match="only 1 of 2 are not locked"):
        select_gpus(TWO, parse_gpu_request("2"), exclude={1})
    with pytest.raises(UsageError, match="another multigpu job has locked"):
        select_gpus(TWO, parse_gpu_request("1,"), exclude={1})
    with pytest.raises(UsageError, match="locked"):
        select_gpus(TWO, parse_gpu_request("auto"), exclude={0})

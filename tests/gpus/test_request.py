"""``--gpus`` parsing: auto, counts, indices (trailing comma) and every bad input."""

from __future__ import annotations

import pytest

from multigpu.errors import UsageError
from multigpu.gpus import parse_gpu_request
from multigpu.gpus.types import GPURequest


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("auto", GPURequest(kind="auto")),
        (" AUTO ", GPURequest(kind="auto")),
        ("1", GPURequest(kind="count", count=1)),
        ("4", GPURequest(kind="count", count=4)),
        ("0,", GPURequest(kind="indices", indices=(0,))),
        ("2,", GPURequest(kind="indices", indices=(2,))),
        ("1,0", GPURequest(kind="indices", indices=(1, 0))),
        (" 0, 3 ,", GPURequest(kind="indices", indices=(0, 3))),
    ],
)
def test_good(text: str, expected: GPURequest) -> None:
    assert parse_gpu_request(text) == expected


def test_zero_explains_cpu_and_index_zero() -> None:
    with pytest.raises(UsageError) as e:
        parse_gpu_request("0")
    assert "--cpu N" in str(e.value) and '"--gpus 0,"' in str(e.value)


def test_duplicates_named() -> None:
    with pytest.raises(UsageError, match="GPU 0 more than once"):
        parse_gpu_request("0,0")
    with pytest.raises(UsageError, match="GPU 1, 2 more than once"):
        parse_gpu_request("2,1,2,1,")


@pytest.mark.parametrize(
    "text", ["-1", "x", "", " ", "1.5", "0,x", ",", ",0", "0,,1", "-1,", "2,-1"]
)
def test_bad(text: str) -> None:
    with pytest.raises(UsageError) as e:
        parse_gpu_request(text)
    assert isinstance(e.value, ValueError)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"kind": "count"},
        {"kind": "count", "count": 0},
        {"kind": "auto", "count": 2},
        {"kind": "indices", "indices": ()},
        {"kind": "indices", "indices": (1, 1)},
        {"kind": "nope"},
    ],
)
def test_inconsistent_request_objects(kwargs: dict) -> None:
    with pytest.raises(UsageError):
        GPURequest(**kwargs)


def test_as_option_round_trips() -> None:
    for text in ("auto", "3", "0,", "2,0"):
        assert parse_gpu_request(parse_gpu_request(text).as_option().split()[1]) == (
            parse_gpu_request(text)
        )

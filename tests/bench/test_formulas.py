"""Bandwidth formulas (nccl-tests' PERFORMANCE.md), size sweeps, options, the throughput math."""

from __future__ import annotations

import itertools

import pytest

from multigpu.cli.bench import parse_comm_args
from multigpu.diagnostics.bench.bandwidth import (
    Shape,
    algbw_gbps,
    bus_factor,
    busbw_gbps,
    shape_for,
)
from multigpu.diagnostics.bench.comm_worker import expected_output
from multigpu.diagnostics.bench.scaling import Row, step_stats, with_speedups
from multigpu.diagnostics.bench.sizes import (
    DEFAULT_SIZES,
    format_size,
    parse_ops,
    parse_size,
    parse_sizes,
)
from multigpu.diagnostics.bench.splits import core_splits, fastest
from multigpu.diagnostics.child_run import find_reason
from multigpu.errors import UsageError


@pytest.mark.parametrize(
    ("op", "n", "factor"),
    [
        ("all_reduce", 2, 1.0),  # 2(n-1)/n
        ("all_reduce", 4, 1.5),
        ("all_reduce", 8, 1.75),
        ("all_gather", 2, 0.5),  # (n-1)/n
        ("all_gather", 8, 0.875),
        ("reduce_scatter", 4, 0.75),
        ("broadcast", 8, 1.0),
    ],
)
def test_bus_factor_is_nccl_tests(op: str, n: int, factor: float) -> None:
    assert bus_factor(op, n) == pytest.approx(factor)


def test_algbw_is_size_over_time_in_decimal_gigabytes() -> None:
    assert algbw_gbps(64 << 20, 0.1) == pytest.approx((64 << 20) / 0.1 / 1e9)
    # 1 GB all-reduced in 1 s on 4 ranks: each link carried 2(n-1)/n = 1.5 GB.
    assert busbw_gbps("all_reduce", 10**9, 1.0, 4) == pytest.approx(1.5)
    assert busbw_gbps("broadcast", 10**9, 2.0, 4) == pytest.approx(0.5)


def test_all_gather_and_reduce_scatter_size_is_the_total_rounded_to_whole_ranks() -> None:
    # 1000 B on 3 ranks: 250 floats -> 83 per rank -> 249 in all (nccl-tests rounds down too).
    assert shape_for("all_gather", 1000, 3) == Shape(
        input_numel=83, output_numel=249, size_bytes=996
    )
    assert shape_for("reduce_scatter", 1000, 3) == Shape(
        input_numel=249, output_numel=83, size_bytes=996
    )
    assert shape_for("all_reduce", 1000, 3) == Shape(
        input_numel=250, output_numel=250, size_bytes=1000
    )
    assert shape_for("all_gather", 4, 2) is None  # one float cannot be split over 2 ranks
    assert shape_for("broadcast", 3, 2) is None  # less than one float


def test_expected_outputs_when_rank_r_holds_r_plus_1() -> None:
    shape = Shape(input_numel=2, output_numel=4, size_bytes=16)
    assert expected_output("all_gather", shape, 1, 2).tolist() == [1, 1, 2, 2]
    rs = Shape(input_numel=4, output_numel=2, size_bytes=16)
    assert expected_output("reduce_scatter", rs, 0, 2).tolist() == [3, 3]
    ar = Shape(input_numel=3, output_numel=3, size_bytes=12)
    assert expected_output("all_reduce", ar, 2, 4).tolist() == [10, 10, 10]
    assert expected_output("broadcast", ar, 3, 4).tolist() == [1, 1, 1]


def test_sizes_parse_lists_ranges_and_binary_suffixes() -> None:
    assert parse_size("64") == 64
    assert parse_size("1K") == 1024
    assert parse_size("64MB") == 64 << 20
    assert parse_size("2GiB") == 2 << 30
    assert parse_sizes("1K,64K,1K") == (1024, 65536)
    assert parse_sizes("8:512") == (8, 32, 128, 512)
    assert parse_sizes("1K:8K:2") == (1024, 2048, 4096, 8192)
    assert parse_sizes("8:100") == (8, 32)  # stops below MAX
    assert DEFAULT_SIZES[0] == 16 and DEFAULT_SIZES[-1] == 64 << 20 and len(DEFAULT_SIZES) == 12
    assert all(b == 4 * a for a, b in itertools.pairwise(DEFAULT_SIZES))
    sizes = [format_size(s) for s in (48, 1024, 1536, 64 << 20)]
    assert sizes == ["48 B", "1 KB", "1.5 KB", "64 MB"]


@pytest.mark.parametrize("bad", ["0", "-1", "1X", "abc", "", "2T", "64M:8", "8:64M:1", "1:2:3:4"])
def test_bad_sizes_are_usage_errors(bad: str) -> None:
    with pytest.raises(UsageError, match="--sizes"):
        parse_sizes(bad)


def test_ops_accept_hyphens_and_all_and_refuse_others() -> None:
    assert parse_ops("all-reduce, broadcast") == ("all_reduce", "broadcast")
    assert parse_ops("all") == ("all_reduce", "all_gather", "broadcast", "reduce_scatter")
    with pytest.raises(UsageError, match="'alltoall' is not a collective"):
        parse_ops("all_reduce,alltoall")


def test_comm_options_defaults_and_errors() -> None:
    opts = parse_comm_args([])
    assert opts.sizes == DEFAULT_SIZES and opts.iters == 20 and opts.warmup == 5
    assert opts.nproc is None and len(opts.ops) == 4
    assert parse_comm_args(["--sizes", "1K,64K", "--nproc", "3"]).nproc == 3
    with pytest.raises(UsageError, match="--nproc"):
        parse_comm_args(["--nproc", "1"])  # one process has nobody to talk to
    with pytest.raises(UsageError, match="'1Q' is not a size"):
        parse_comm_args(["--sizes", "1Q"])


def test_step_stats_uses_the_median_gap_after_warmup_and_the_slowest_rank() -> None:
    # Rank 0: steps end at 0,1 (warm-up), then every 0.1 s but one 1 s pause (an evaluation).
    fast = [0.0, 1.0, 1.1, 1.2, 2.2, 2.3, 2.4]
    slow = [0.0, 1.0, 1.2, 1.4, 2.4, 2.6, 2.8]
    one = step_stats([{"step_ends": fast, "samples_per_step": 32}], warmup=2)
    assert one.timed_steps == 5
    assert one.samples_per_second == pytest.approx(32 / 0.1)  # the pause is not training speed
    assert one.samples_per_second_mean == pytest.approx(32 / (1.4 / 5))  # ... but counts here
    both = step_stats([{"step_ends": fast, "samples_per_step": 32}, {"step_ends": slow}], warmup=2)
    assert both.samples_per_second == pytest.approx(32 / 0.2)
    assert both.steps_per_second == pytest.approx(5.0)
    no_loader = step_stats([{"step_ends": fast, "samples_per_step": None}], warmup=2)
    assert no_loader.samples_per_second is None and no_loader.steps_per_second == pytest.approx(10)
    short = step_stats([{"step_ends": [0.0, 1.0]}], warmup=2)
    assert "only 2 optimizer step(s)" in short.error and short.samples_per_second is None


def _row(processes: int, sps: float | None) -> Row:
    return Row(
        processes=processes,
        threads=1,
        samples_per_second=sps,
        steps_per_second=None if sps is None else sps / 64,
        step_ms=None,
        samples_per_second_mean=sps,
    )


def test_speedup_and_efficiency_against_the_smallest_world_size() -> None:
    rows = with_speedups([_row(1, 1000.0), _row(2, 1800.0), _row(4, 2000.0), _row(8, None)])
    assert [r.speedup for r in rows[:3]] == pytest.approx([1.0, 1.8, 2.0])
    assert [r.efficiency for r in rows[:3]] == pytest.approx([1.0, 0.9, 0.5])
    assert rows[3].speedup is None and rows[3].efficiency is None  # a failed run stays blank
    from_two = with_speedups([_row(2, 1000.0), _row(4, 1500.0)])
    assert from_two[1].efficiency == pytest.approx(0.75)  # speed-up 1.5 on twice the processes


def test_a_row_is_the_median_of_its_repeats_and_keeps_the_best() -> None:
    from multigpu.diagnostics.bench.scaling import Config, Measurement, summarize

    runs = [
        Measurement(samples_per_second=s, steps_per_second=s / 32, timed_steps=50)
        for s in (2000.0, 19000.0, 2500.0)
    ]
    row = summarize(Config(processes=1, threads=2), [*runs, Measurement(error="exit code 1: x")])
    assert row.samples_per_second == 2500.0 and row.best == 19000.0
    assert row.runs == [2000.0, 19000.0, 2500.0, None]
    assert row.error == "" and row.timed_steps == 50  # one failed repeat: the others count
    assert row.failed_runs == ["exit code 1: x"]  # ... and it is named


def test_core_splits_and_the_fastest() -> None:
    assert core_splits(1) == [(1, 1)]
    assert core_splits(2) == [(1, 2), (2, 1)]
    assert core_splits(6) == [(1, 6), (2, 3), (3, 2), (6, 1)]
    assert fastest({(1, 2): 100.0, (2, 1): 190.0}) == (2, 1)
    assert fastest({(1, 2): 100.0, (2, 1): 100.0}) == (1, 2)  # a tie: fewer processes
    assert fastest({(1, 2): None}) is None


def test_the_reason_of_a_failed_run_is_the_workers_exception_not_torchs_summary() -> None:
    stderr = """[rank0]: Traceback (most recent call last):
[rank0]:   File "train.py", line 17, in <module>
[rank0]: multigpu.errors.UsageError: batch_size=32 is not divisible by world_size=3
E1122 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1)
multigpu: error: the workers stopped on a usage error (exit code 2); their message is above
============================================================
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
"""
    assert find_reason(stderr) == (
        "multigpu.errors.UsageError: batch_size=32 is not divisible by world_size=3"
    )
    assert find_reason("multigpu: error: script 'x.py' does not exist") == (
        "multigpu: error: script 'x.py' does not exist"
    )
    assert find_reason("Segmentation fault") == ""

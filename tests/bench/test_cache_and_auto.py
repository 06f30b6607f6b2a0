"""The measured CPU split: the cache file, ``--cpu auto`` in the launch plan, the step recorder."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from multigpu.cli.main import build_run_parser, options_from_namespace
from multigpu.common.arguments import cpu_count_arg
from multigpu.errors import UsageError
from multigpu.instruments.bench_record import BenchRecorder
from multigpu.instruments.verify_record import VerifyRecorder, VerifyStop
from multigpu.launch.cpu_split import (
    SplitRecord,
    cache_path,
    cpu_auto_split,
    find_record,
    save_record,
    script_key,
    torch_version,
)
from multigpu.launch.options import LaunchOptions
from multigpu.launch.plan import build_plan, request_devices
from multigpu.session.initialize import verify_or_bench


def _record(script: str, best: tuple[int, int], cores: int = 2) -> None:
    measured = {"1x2": 100.0, "2x1": 150.0 if best == (2, 1) else 50.0}
    save_record(
        SplitRecord(
            cores=cores,
            script=script,
            processes=best[0],
            threads=best[1],
            samples_per_second=150.0,
            measured=measured,
        )
    )


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MULTIGPU_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "cpu_split.json"


def test_cache_path_follows_multigpu_cache_dir_then_xdg_then_home() -> None:
    assert cache_path({"MULTIGPU_CACHE_DIR": "/c", "XDG_CACHE_HOME": "/x"}) == Path(
        "/c/cpu_split.json"
    )
    assert cache_path({"XDG_CACHE_HOME": "/x"}) == Path("/x/multigpu/cpu_split.json")
    assert cache_path({}) == Path.home() / ".cache" / "multigpu" / "cpu_split.json"


def test_records_are_kept_per_script_and_replaced_by_a_new_measurement(cache: Path) -> None:
    _record("/a/train.py", (2, 1))
    _record("multigpu.examples.digits", (1, 2))
    _record("/a/train.py", (1, 2))  # measured again: replaces the first
    entries = json.loads(cache.read_text())["entries"]
    assert [(e["script"], e["processes"]) for e in entries] == [
        ("multigpu.examples.digits", 1),
        ("/a/train.py", 1),
    ]
    assert entries[0]["host"] == socket.gethostname() and entries[0]["torch"] == torch_version()
    found = find_record("/a/train.py", 2)
    assert found is not None and found[1] is True
    other = find_record("/b/other.py", 2)  # another script on this machine: the newest entry
    assert other is not None and other[0].script == "/a/train.py" and other[1] is False
    assert find_record("/a/train.py", 4) is None  # another core count is another machine


def test_auto_without_a_measurement_is_one_process_and_says_how_to_measure(cache: Path) -> None:
    processes, note = cpu_auto_split("train.py", is_module=False, cores=2)
    assert processes == 1
    assert "no measured split" in note and "`multigpu bench scaling`" in note
    assert "\n" not in note  # one log line


def test_auto_uses_the_split_measured_for_this_script(cache: Path, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    _record(script_key(str(script), is_module=False), (2, 1))
    processes, note = cpu_auto_split(str(script), is_module=False, cores=2)
    assert processes == 2
    assert "2 process(es) x 1 thread(s)" in note and "this script" in note and "2x1 150" in note


def test_a_corrupt_cache_is_ignored_with_a_warning(
    cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache.parent.mkdir(parents=True)
    cache.write_text("{not json")
    assert cpu_auto_split("t.py", is_module=False, cores=2)[0] == 1
    assert "ignoring the CPU split cache" in caplog.text
    _record("t.py", (2, 1))  # the next measurement rewrites it
    assert json.loads(cache.read_text())["format"] == 1


def test_an_entry_without_its_host_is_not_taken_for_a_measurement_made_here(
    cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _record("t.py", (2, 1))
    data = json.loads(cache.read_text())
    del data["entries"][0]["host"]  # a hand-edited or truncated cache
    cache.write_text(json.dumps(data))
    assert cpu_auto_split("t.py", is_module=False, cores=2)[0] == 1
    assert "ignoring the CPU split cache" in caplog.text


def test_cpu_auto_on_the_command_line_reaches_the_plan(cache: Path, tmp_path: Path) -> None:
    assert cpu_count_arg("auto") == "auto"
    script = tmp_path / "train.py"
    script.write_text("")
    ns = build_run_parser().parse_args(["--cpu", "auto", str(script)])
    options = options_from_namespace(ns, script=ns.training_script, script_args=[])
    assert options.cpu == "auto"
    request = request_devices(options, gpu_count=0, cores=4)
    before = build_plan(options, request, environ={}, cores=4)
    assert (before.nproc_per_node, before.threads_per_process) == (1, 4)
    assert "run `multigpu bench scaling`" in before.notes[0]
    _record(script_key(str(script), is_module=False), (2, 1), cores=4)
    after = build_plan(options, request_devices(options, gpu_count=0, cores=4), environ={}, cores=4)
    assert (after.nproc_per_node, after.threads_per_process) == (2, 2)
    assert after.env["OMP_NUM_THREADS"] == "2"
    assert "measured for this script" in after.notes[0]


def test_cpu_auto_with_strategy_dp_or_a_contradicting_nproc_is_refused(cache: Path) -> None:
    _record("multigpu.examples.digits", (2, 1))
    dp = LaunchOptions(
        script="multigpu.examples.digits", cpu="auto", one_process=True, torchrun={"module": True}
    )
    with pytest.raises(UsageError, match="dp runs ONE process"):
        request_devices(dp, gpu_count=0, cores=2)
    both = LaunchOptions(script="t.py", cpu="auto", torchrun={"nproc_per_node": "2"})
    with pytest.raises(UsageError, match="contradicts --cpu auto"):
        request_devices(both, gpu_count=0, cores=2)


def test_the_bench_recorder_is_chosen_only_under_bench(tmp_path: Path) -> None:
    assert verify_or_bench({}, 0, 1) is None
    bench = verify_or_bench({"MULTIGPU_BENCH_DIR": str(tmp_path)}, 0, 1)
    assert isinstance(bench, BenchRecorder)
    verify = verify_or_bench({"MULTIGPU_VERIFY_DIR": str(tmp_path)}, 0, 1)
    assert type(verify) is VerifyRecorder


def test_bench_probe_times_steps_and_stops_after_the_last(tmp_path: Path) -> None:
    probe = BenchRecorder(tmp_path, steps=3, rank=0, world_size=1)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe.on_setup(None, model, [optimizer])
    for batch, shuffle in ((8, False), (32, True)):  # an evaluation loader; the training one counts
        sampler = SimpleNamespace(
            global_batch_size=batch, num_samples=64, shuffle=shuffle, accumulation_steps=1, seed=0
        )
        probe.on_loader(None, SimpleNamespace(sampler=sampler))
    for _ in range(2):
        model(torch.ones(4, 2)).sum().backward()
        optimizer.step()
    assert not (tmp_path / "bench-rank0.json").exists()
    with pytest.raises(VerifyStop) as stop:
        optimizer.step()
    assert stop.value.code == 0  # a clean exit of the script
    record = json.loads((tmp_path / "bench-rank0.json").read_text())
    assert record["steps"] == 3 and record["samples_per_step"] == 32
    ends = record["step_ends"]
    assert len(ends) == 3 and ends == sorted(ends) and ends[0] > 0
    assert record["device"] == "cpu" and record["threads"] == torch.get_num_threads()


def test_train_cpu_auto_dry_run_uses_a_recorded_split_or_the_default(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from multigpu.cli.main import main
    from multigpu.common.host import usable_cores

    cores = usable_cores()
    assert main(["train", "--cpu", "auto", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"processes: 1 per node, {cores} thread(s) each" in out
    assert "run `multigpu bench scaling`" in out
    _record("multigpu.examples.digits", (2, max(1, cores // 2)), cores=cores)
    assert main(["train", "--cpu", "auto", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "processes: 2 per node" in out and "--nproc-per-node=2" in out
    assert "measured for this script" in out

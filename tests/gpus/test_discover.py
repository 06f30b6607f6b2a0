"""The discover_gpus chain on this machine, the torch discover_gpus's parser and the table."""

from __future__ import annotations

import json

from multigpu.gpus import format_gpu_table, list_gpus
from multigpu.gpus.facts import discover_gpus
from multigpu.gpus.torch_probe import has_gpu_device_node, parse_torch_probe, read_torch
from multigpu.gpus.visible import visible_devices
from tests.cpu_time import cpu_seconds

from .recorded import inventory


def test_no_gpu_machine_answers_empty_and_fast() -> None:
    if has_gpu_device_node():
        return  # a GPU machine: the recorded-output tests cover the parsing there
    list_gpus()  # warm up imports (pynvml) so the timing is about probing
    started = cpu_seconds()
    assert list_gpus() == []
    assert list_gpus({"CUDA_VISIBLE_DEVICES": "0"}) == []
    assert discover_gpus().source == "none"
    assert read_torch() is None
    # Fast: no probe process (a child importing torch costs over 1.5 s of CPU). CPU time, not
    # wall time: on a loaded machine the same milliseconds of work take any wall time.
    assert cpu_seconds() - started < 0.5


def test_torch_probe_output() -> None:
    text = (
        "some warning line\n"
        '[{"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "8a2c3f52-aaaa", '
        '"free": 84401225728, "total": 85031714816, "pci": "00000000:19:00.0"},'
        ' {"index": 1, "name": "AMD Instinct MI250X", "uuid": "", "free": 0, "total": 0,'
        ' "pci": ""}]\n'
    )
    h100, mi250 = parse_torch_probe(json.loads(text.splitlines()[-1]))
    assert (h100.uuid, h100.visible_id) == ("GPU-8a2c3f52-aaaa", "0")
    assert (h100.memory_total_mib, h100.memory_free_mib) == (81092, 80491)
    assert h100.utilization_percent is None
    assert (mi250.uuid, mi250.visible_id) == ("index-1", "1")


def test_table_lists_physical_logical_and_processes() -> None:
    gpus = visible_devices(inventory("a100x8"), {"CUDA_VISIBLE_DEVICES": "4,0"})
    lines = format_gpu_table(gpus).splitlines()
    assert lines[0].split() == ["GPU", "CUDA", "NAME", "FREE/TOTAL", "MiB", "UTIL", "PROCESSES"]
    assert lines[1].split() == [
        "4",
        "0",
        "NVIDIA",
        "A100-SXM4-80GB",
        "6245/81920",
        "100%",
        "50877,50901",
    ]
    assert lines[2].split()[:2] == ["0", "1"] and lines[2].endswith("-")
    table = format_gpu_table(inventory("na").gpus)  # physical GPUs: no logical index
    assert "n/a" in table and table.splitlines()[1].split()[:2] == ["0", "-"]
    # columns line up: every row has its name and its memory where the header has them
    col_name, col_mem = lines[0].index("NAME"), lines[0].index("FREE/TOTAL")
    assert all(line[col_name:].startswith("NVIDIA") for line in lines[1:])
    assert all(line[col_mem - 2 : col_mem] == "  " and line[col_mem] != " " for line in lines[1:])

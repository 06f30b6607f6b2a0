"""What a rank has: the tightest of the limits, from recorded files, plus real reads."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import torch

from multigpu.estimate import Capacity, cpu_capacity, device_capacity, gpus_capacity
from multigpu.estimate.capacity import V1, V2, cgroup_room, read_memory_files
from tests.gpus.recorded import h100

GIB = 2**30
MEMINFO = "MemTotal:       24684084 kB\nMemFree:  1 kB\nMemAvailable:   16777216 kB\n"  # 16 GiB
STATUS = "Name:\tpython\nVmSize:\t 4194304 kB\nVmData:\t 1048576 kB\n"  # 4 GiB, 1 GiB


def test_memavailable_is_shared_by_the_processes_of_the_node() -> None:
    found = cpu_capacity(4, files={"/proc/meminfo": MEMINFO}, limits={})
    assert found == Capacity(bytes=4 * GIB, source="MemAvailable 16.0 GiB / 4 processes")


def test_a_cgroup_v2_limit_less_its_usage_bounds_it_and_page_cache_counts_as_room() -> None:
    files = {
        "/proc/meminfo": MEMINFO,
        V2[0]: f"{12 * GIB}\n",
        V2[1]: f"{4 * GIB}\n",
        V2[2]: f"anon {GIB}\ninactive_file {2 * GIB}\nactive_file 0\n",
    }
    found = cpu_capacity(2, files=files, limits={})
    assert found.bytes == 5 * GIB  # (12 - (4 - 2)) / 2
    assert found.source == "cgroup memory limit, 10.0 GiB free / 2 processes"


def test_cgroup_v1_and_its_no_limit_value() -> None:
    files = {"/proc/meminfo": MEMINFO, V1[0]: "9223372036854771712\n", V1[1]: "123\n"}
    assert cpu_capacity(1, files=files, limits={}).source.startswith("MemAvailable")
    files = {"/proc/meminfo": MEMINFO, V1[0]: f"{2 * GIB}", V1[1]: f"{GIB}", V1[2]: ""}
    assert cpu_capacity(1, files=files, limits={}).bytes == GIB
    assert cgroup_room("max\n", "5\n") is None and cgroup_room(None, None) is None


def test_rlimit_data_counts_against_vmdata_and_rlimit_as_against_vmsize() -> None:
    files = {"/proc/meminfo": MEMINFO, "/proc/self/status": STATUS}
    data = cpu_capacity(1, files=files, limits={"RLIMIT_DATA": 3 * GIB})
    assert data.bytes == 2 * GIB and data.source.startswith("RLIMIT_DATA 3.0 GiB")
    address = cpu_capacity(1, files=files, limits={"RLIMIT_AS": 5 * GIB, "RLIMIT_DATA": 8 * GIB})
    assert address.bytes == GIB and address.source.startswith("RLIMIT_AS 5.0 GiB")
    unlimited = {"RLIMIT_DATA": resource.RLIM_INFINITY, "RLIMIT_AS": resource.RLIM_INFINITY}
    assert cpu_capacity(1, files=files, limits=unlimited).source.startswith("MemAvailable")


def test_nothing_readable_is_zero_and_says_so() -> None:
    found = cpu_capacity(2, files={}, limits={})
    assert found.bytes == 0 and "unknown" in found.source


def test_the_tightest_cgroup_on_the_path_is_read(tmp_path: Path) -> None:
    (tmp_path / "memory.max").write_text("max\n")
    (tmp_path / "memory.current").write_text("0\n")
    files = read_memory_files(root=str(tmp_path))
    assert files[V2[0]] is None  # no limit at the root: none read
    (tmp_path / "memory.max").write_text(f"{3 * GIB}\n")
    (tmp_path / "memory.current").write_text(f"{GIB}\n")
    files = read_memory_files(root=str(tmp_path))
    assert files[V2[0]] == f"{3 * GIB}\n" and files[V2[1]] == f"{GIB}\n"
    assert cpu_capacity(1, files=files, limits={}).bytes <= 2 * GIB


def test_this_machine_can_be_read() -> None:
    files = read_memory_files()
    assert files["/proc/meminfo"] and "VmData" in (files["/proc/self/status"] or "")
    found = device_capacity(torch.device("cpu"), 2)
    assert found.kind == "cpu" and 0 < found.bytes < 2**50, found


def test_a_real_rlimit_data_bounds_a_real_process() -> None:
    code = (
        "import resource; from multigpu.estimate import cpu_capacity\n"
        "resource.setrlimit(resource.RLIMIT_DATA, (3 * 2**30, resource.RLIM_INFINITY))\n"
        "c = cpu_capacity(1); print(c.bytes, c.source)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    number, source = out.stdout.split(" ", 1)
    assert source.startswith("RLIMIT_DATA 3.0 GiB of this process"), out.stdout
    # Below the limit by the interpreter's own data: about 0.3 GiB with a CPU build of torch,
    # 1.25 GiB with a CUDA build (its libraries' data, seen on an H100 machine).
    assert GIB < int(number) < 3 * GIB


def test_gpus_are_picked_as_the_launcher_does_and_the_least_free_bounds() -> None:
    gpus = [h100(0, 1000), h100(1, 70000), h100(2, 60000)]
    found = gpus_capacity(gpus, 2)
    assert found is not None and found.kind == "cuda"
    assert found.bytes == 60000 * 2**20
    assert (
        found.source == "GPU 2: NVIDIA H100 80GB HBM3 79.6 GiB, 58.6 GiB free (the least free of 2)"
    )
    assert gpus_capacity(gpus, 4) is None and gpus_capacity([], 1) is None

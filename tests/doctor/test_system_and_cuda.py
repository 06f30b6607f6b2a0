"""Software, CPU, /dev/shm, CUDA, driver and NCCL checks, given their inputs."""

from __future__ import annotations

import os

import pytest
import torch

from multigpu.diagnostics.doctor.cuda import (
    CudaFacts,
    cuda_checks,
    cuda_facts_in_child,
    driver_check,
    torch_cuda_facts,
)
from multigpu.diagnostics.doctor.system import (
    GiB,
    MiB,
    allocator_check,
    quota_check,
    read_shm,
    shm_check,
    software_checks,
    thread_check,
)
from multigpu.gpus import DriverFacts, read_facts
from tests.gpus.fake_nvml import NoNVML
from tests.gpus.recorded import Recorded
from tests.launch._util import child_env

ON_GPU = CudaFacts(available=True, device_count=2, nccl="2.27.3")
NO_CUDA = CudaFacts(available=False, device_count=0, nccl="2.27.3", why="driver too old")
CU128 = {"torch_version": "2.13.0+cu128", "build_cuda": "12.8", "build_hip": None}
DRIVER = DriverFacts(version="570.86.15", cuda="12.8", source="nvml")


def test_software_rows_name_this_torch_and_its_backends() -> None:
    rows = {r.name: r for r in software_checks()}
    assert torch.__version__ in rows["torch"].value
    assert rows["python"].status == "OK" and rows["multigpu"].status == "OK"
    assert rows["backends"].status == "OK" and "gloo yes" in rows["backends"].value


@pytest.mark.parametrize(
    ("omp", "processes", "torch_threads", "status", "said"),
    [
        (None, 1, 2, "OK", "1 process(es) x 2 torch thread(s); OMP_NUM_THREADS unset"),
        ("1", 2, 1, "OK", "2 process(es) x 1 torch thread(s); OMP_NUM_THREADS=1"),
        (None, 2, 2, "WARN", "each process may start 2 threads, 4 on 2 cores"),
        ("2", 2, 2, "WARN", "4 threads on 2 cores"),
        ("8", 1, 8, "WARN", "8 threads on 2 cores"),
        ("two", 1, 2, "WARN", "not a whole number"),
    ],
)
def test_threads_warn_when_processes_times_threads_exceed_the_cores(
    omp: str | None, processes: int, torch_threads: int, status: str, said: str
) -> None:
    environ = {} if omp is None else {"OMP_NUM_THREADS": omp}
    row = thread_check(environ, cores=2, torch_threads=torch_threads, local_processes=processes)
    assert row.status == status and said in row.value, row
    if status == "WARN":
        assert f"OMP_NUM_THREADS={max(2 // processes, 1)}" in row.fix


def test_the_cpu_workers_allocator_row() -> None:
    libs = ("/v/lib/libtbbmalloc.so.2", "/v/lib/libtbbmalloc_proxy.so.2")
    row = allocator_check({}, libs)
    assert row.status == "OK" and "oneTBB's" in row.value
    assert row.detail["LD_PRELOAD"] == ":".join(libs)
    row = allocator_check({"MULTIGPU_CPU_ALLOCATOR": "system"}, libs)
    assert row.status == "OK" and "MULTIGPU_CPU_ALLOCATOR=system" in row.value
    row = allocator_check({"LD_PRELOAD": "/opt/libjemalloc.so"}, libs)
    assert row.status == "OK" and "/opt/libjemalloc.so" in row.value
    row = allocator_check({"MULTIGPU_CPU_ALLOCATOR": "jemalloc"}, libs)
    assert row.status == "FAIL" and "expected one of auto, tbb, system" in row.value
    missing = allocator_check({}, None)  # this machine: Linux x86_64, where tbb has wheels
    assert missing.status == "WARN" and missing.fix.startswith("pip install tbb"), missing


def test_a_cgroup_cpu_quota_below_the_visible_cores_warns() -> None:
    row = quota_check("150000 100000\n", cores=16)
    assert row.status == "WARN" and "1.5 CPUs" in row.value and "16 cores" in row.value
    assert "OMP_NUM_THREADS=1" in row.fix
    assert quota_check("800000 100000", cores=8).status == "OK"
    assert quota_check("max 100000", cores=8).value == "no cgroup CPU quota"
    assert quota_check(None, cores=8).status == "OK"


def test_shm_below_a_gib_warns_with_the_container_fix() -> None:
    docker = shm_check(64 * MiB, 64 * MiB)
    assert docker.status == "WARN" and docker.value.startswith("64 MiB (64 MiB free)")
    assert "--shm-size" in docker.fix and "--ipc=host" in docker.fix
    assert shm_check(2 * GiB).status == "OK"
    assert shm_check(None).status == "WARN" and "missing" in shm_check(None).value


def test_shm_is_read_from_the_real_filesystem() -> None:
    size, free = read_shm()
    stat = os.statvfs("/dev/shm")
    assert size == stat.f_frsize * stat.f_blocks and free is not None and 0 <= free <= size
    assert read_shm("/no/such/dir") == (None, None)


def test_cpu_only_torch_skips_cuda_rows_but_warns_when_gpus_are_here() -> None:
    args = {"torch_version": "2.13.0+cpu", "build_cuda": None, "build_hip": None, "facts": None}
    rows = cuda_checks(gpus=0, driver=None, **args)
    assert [(r.name, r.status) for r in rows] == [
        ("runtime", "SKIP"),
        ("driver", "SKIP"),
        ("NCCL", "SKIP"),
    ]
    assert "CPU-only build" in rows[0].value
    rows = cuda_checks(gpus=2, driver=DRIVER, **args)
    assert rows[0].status == "WARN" and "pytorch.org/get-started" in rows[0].fix
    assert rows[1].status == "OK" and "570.86.15" in rows[1].value


def test_cuda_build_with_working_gpus_reports_runtime_driver_and_nccl() -> None:
    rows = cuda_checks(gpus=2, facts=ON_GPU, driver=DRIVER, **CU128)
    assert [r.status for r in rows] == ["OK", "OK", "OK"]
    assert rows[0].value == "CUDA 12.8, torch sees 2 device(s)"
    assert rows[2].value.startswith("2.27.3")


def test_cuda_unavailable_with_gpus_fails_and_blames_an_old_driver() -> None:
    old = DriverFacts(version="470.57.02", cuda="11.4", source="nvidia-smi")
    runtime, driver, _ = cuda_checks(gpus=1, facts=NO_CUDA, driver=old, **CU128)
    assert runtime.status == "FAIL" and "driver too old" in runtime.value
    assert "supports CUDA 11.4 only" in runtime.fix
    assert driver.status == "FAIL" and "torch needs CUDA 12.8" in driver.value
    assert "upgrade the NVIDIA driver" in driver.fix
    no_nccl = CudaFacts(available=True, device_count=1, nccl=None)
    missing = cuda_checks(gpus=1, facts=no_nccl, driver=DRIVER, **CU128)
    assert missing[2].status == "FAIL" and "no NCCL" in missing[2].value


def test_driver_one_minor_version_behind_torch_warns() -> None:
    row = driver_check("12.8", DriverFacts(version="550.54", cuda="12.4", source="nvml"), 1)
    assert row.status == "WARN" and "minor-version compatibility" in row.value
    assert driver_check("12.4", DRIVER, 1).status == "OK"
    assert driver_check("12.8", None, 1).status == "FAIL"  # GPUs and a CUDA torch, no driver
    assert driver_check(None, None, 0).status == "SKIP"


def test_without_nvml_the_driver_row_comes_from_nvidia_smis_query_modes() -> None:
    recorded = read_facts({}, nvml=NoNVML(), runner=Recorded("a100x8"))
    row = driver_check("12.8", recorded.driver, 8)
    assert row.status == "OK" and row.value == "570.86.15, supports CUDA 12.8 (from nvidia-smi)"
    old = read_facts({}, nvml=NoNVML(), runner=Recorded("two_busy"))  # its -q -x failed
    assert driver_check("12.8", old.driver, 2).value == (
        "535.183.01, supports CUDA ? (from nvidia-smi)"
    )
    assert read_facts({}, nvml=NoNVML(), runner=Recorded(None)).driver is None


def test_cuda_facts_are_the_same_in_a_child_as_in_this_process() -> None:
    here = torch_cuda_facts()
    child = cuda_facts_in_child(child_env())
    assert child == here
    assert here.available == torch.cuda.is_available()
    if torch.version.cuda is None:
        assert here.nccl is None and here.device_count == 0

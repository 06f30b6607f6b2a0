"""``read_facts``: GPUs, driver and links from NVML in one session, nvidia-smi's machine-readable
modes only where NVML cannot be loaded, and nothing at all on this GPU-less machine."""

from __future__ import annotations

from itertools import combinations

import pynvml
import pytest

from multigpu.gpus import GPUFacts, read_facts
from multigpu.gpus.smi import parse_cuda_xml, parse_driver_csv, read_smi_driver
from multigpu.gpus.topology import nvml_links, parse_topo_matrix
from multigpu.gpus.torch_probe import has_gpu_device_node
from multigpu.gpus.types import DriverFacts
from tests.cpu_time import cpu_seconds

from .fake_nvml import SWITCH, FakeNVML, LinkedNVML, NoNVML, nvml_error
from .recorded import Recorded, recorded

NV570 = DriverFacts(version="570.86.15", cuda="12.8", source="nvml")


def test_nvml_answers_gpus_driver_and_links_in_one_session_without_nvidia_smi() -> None:
    fake, smi = FakeNVML(), Recorded("a100x8")
    facts = read_facts({}, nvml=fake, runner=smi)
    assert facts.inventory.source == "nvml" and len(facts.inventory.gpus) == 2
    assert len(facts.inventory.migs) == 2
    assert facts.driver == NV570
    assert facts.links == {(0, 1): "PHB"}  # no NVLink: the PCIe common ancestor
    assert (fake.inits, fake.shutdown) == (1, True)
    assert smi.calls == []  # NVML loaded: nvidia-smi is never run
    launcher = read_facts({}, nvml=FakeNVML(), runner=smi, driver=False, links=False)
    assert (launcher.driver, launcher.links) == (None, {})


def test_nvlink_bridges_switches_and_pcie_levels_are_named_as_topo_m_names_them() -> None:
    # GPUs 0 and 1 joined by a 4-link bridge (plus a link that is down), 2 and 3 by none.
    bridged = LinkedNVML(
        4,
        {0: [1, 1, None, 1, 1], 1: [0, 0, 0, 0]},
        {(2, 3): pynvml.NVML_TOPOLOGY_SINGLE, (0, 2): pynvml.NVML_TOPOLOGY_NODE},
        legacy_remote_bus=True,
    )
    facts = read_facts({}, nvml=bridged, runner=Recorded(None))
    assert facts.links == {
        (0, 1): "NV4", (0, 2): "NODE", (0, 3): "SYS",
        (1, 2): "SYS", (1, 3): "SYS", (2, 3): "PIX",
    }  # fmt: skip
    # An HGX A100: every GPU has 12 links, all to NVSwitches. NVML then says what
    # `nvidia-smi topo -m` printed on that machine (the recording), pair for pair.
    hgx = LinkedNVML(8, {i: [SWITCH] * 12 for i in range(8)})
    found = read_facts({}, nvml=hgx, runner=Recorded(None)).links
    assert found == parse_topo_matrix(recorded("a100x8_topo.txt"))
    assert set(found) == set(combinations(range(8), 2)) and set(found.values()) == {"NV12"}
    one = read_facts({}, nvml=LinkedNVML(1, {}), runner=Recorded(None))
    assert one.links == {}


def test_a_pair_nvml_does_not_answer_is_left_out() -> None:
    class Partial(LinkedNVML):
        def nvmlDeviceGetTopologyCommonAncestor(self, a: str, b: str) -> int:
            if {a, b} == {"gpu0", "gpu2"}:
                raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return super().nvmlDeviceGetTopologyCommonAncestor(a, b)

    links = nvml_links(Partial(3, {}), read_facts({}, nvml=Partial(3, {})).inventory.gpus)
    assert links == {(0, 1): "SYS", (1, 2): "SYS"}


def test_the_cuda_version_comes_from_libcuda_else_from_the_driver_record() -> None:
    class NoLibcuda(FakeNVML):
        def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
            raise nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

        def nvmlSystemGetCudaDriverVersion(self) -> int:
            return 12040

    class NoDriverVersion(FakeNVML):
        def nvmlSystemGetDriverVersion(self) -> str:
            raise nvml_error(pynvml.NVML_ERROR_UNKNOWN)

    assert read_facts({}, nvml=NoLibcuda()).driver == DriverFacts(
        version="570.86.15", cuda="12.4", source="nvml"
    )
    no_driver = read_facts({}, nvml=NoDriverVersion(), runner=Recorded("a100x8"))
    assert no_driver.driver is None and no_driver.inventory.source == "nvml"


def test_without_nvml_the_csv_and_xml_query_modes_answer() -> None:
    smi = Recorded("a100x8")
    facts = read_facts({}, nvml=NoNVML(), runner=smi)
    assert facts.inventory.source == "nvidia-smi" and len(facts.inventory.gpus) == 8
    assert facts.inventory.gpus[1].memory_used_mib == 40321
    assert facts.driver == DriverFacts(version="570.86.15", cuda="12.8", source="nvidia-smi")
    assert set(facts.links.values()) == {"NV12"} and len(facts.links) == 28
    assert ["nvidia-smi"] not in smi.calls  # the human-readable page is never parsed
    assert all(
        call[1].startswith("--query-") or call[1:] in (["-L"], ["-q", "-x"], ["topo", "-m"])
        for call in smi.calls
    ), smi.calls

    # An NVML whose inventory query fails is no source either (as before): nvidia-smi answers.
    class Broken(FakeNVML):
        def nvmlDeviceGetCount(self) -> int:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)

    assert read_facts({}, nvml=Broken(), runner=Recorded("two_busy")).inventory.source == (
        "nvidia-smi"
    )


def test_driver_csv_and_xml_parsing() -> None:
    assert parse_driver_csv(recorded("a100x8_driver.csv")) == "570.86.15"
    assert parse_driver_csv("") is None and parse_driver_csv("[N/A]\n") is None
    assert parse_cuda_xml(recorded("a100x8_q.xml")) == "12.8"
    assert parse_cuda_xml("") is None and parse_cuda_xml("No devices were found") is None
    assert (
        parse_cuda_xml("<nvidia_smi_log><driver_version>1</driver_version></nvidia_smi_log>")
        is None
    )
    assert (
        parse_cuda_xml("<nvidia_smi_log><cuda_version>N/A</cuda_version></nvidia_smi_log>") is None
    )
    # An old driver whose -q -x failed: the version still, the CUDA version unknown.
    assert read_smi_driver(Recorded("two_busy")) == DriverFacts(
        version="535.183.01", cuda=None, source="nvidia-smi"
    )


def test_this_machine_has_no_nvml_no_nvidia_smi_and_no_gpu_facts() -> None:
    if has_gpu_device_node():
        pytest.skip("a GPU machine: the stand-ins above cover the reading")
    read_facts()  # imports warmed (pynvml, torch)
    started = cpu_seconds()
    assert read_facts() == GPUFacts()
    assert cpu_seconds() - started < 0.5  # no probe process (CPU time: see test_discover.py)

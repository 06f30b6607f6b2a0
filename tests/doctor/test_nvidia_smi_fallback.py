"""``multigpu gpus`` and ``multigpu doctor`` as real processes where NVML cannot be loaded (this
machine: no libnvidia-ml) and an ``nvidia-smi`` on PATH answers: a small executable replaying
an 8-GPU HGX A100's recorded outputs and logging every command line it is given.

What is proved: the fallback reads only nvidia-smi's query modes (CSV, XML) and ``topo -m`` /
``-L`` (which have no CSV form), never its human-readable page (plain ``nvidia-smi``, which the
doctor used to regex-parse for the driver); the facts reach both commands' outputs.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from multigpu.gpus.smi import LIST, QUERY_APPS, QUERY_DRIVER, QUERY_GPU, QUERY_XML
from multigpu.gpus.topology import TOPO
from multigpu.gpus.torch_probe import has_gpu_device_node
from tests.gpus.recorded import DATA
from tests.launch._util import run_multigpu

pytestmark = pytest.mark.skipif(
    has_gpu_device_node(), reason="a GPU machine: NVML answers, the stand-ins cover it"
)

RECORDINGS = {
    " ".join(QUERY_GPU[1:]): "a100x8_query.csv",
    " ".join(QUERY_APPS[1:]): "a100x8_apps.csv",
    " ".join(LIST[1:]): "a100x8_list.txt",
    " ".join(QUERY_DRIVER[1:]): "a100x8_driver.csv",
    " ".join(QUERY_XML[1:]): "a100x8_q.xml",
    " ".join(TOPO[1:]): "a100x8_topo.txt",
}


def fake_smi(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A PATH whose ``nvidia-smi`` replays the recordings, and the file logging its calls."""
    bin_dir, log = tmp_path / "bin", tmp_path / "smi.log"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-smi"
    script.write_text(
        f"#!{sys.executable}\n"
        "import pathlib, sys\n"
        f"data, recordings = pathlib.Path({str(DATA)!r}), {RECORDINGS!r}\n"
        "line = ' '.join(sys.argv[1:])\n"
        f"with open({str(log)!r}, 'a') as f:\n"
        "    f.write(line + '\\n')\n"
        "if line not in recordings:\n"
        "    sys.exit('fake nvidia-smi: nothing recorded for ' + repr(line))\n"
        "sys.stdout.write((data / recordings[line]).read_text())\n"
    )
    script.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}, log


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_gpus_lists_what_nvidia_smis_csv_says(tmp_path: Path) -> None:
    env, log = fake_smi(tmp_path)
    done = run_multigpu(["gpus", "--json"], tmp_path, **env)
    assert done.returncode == 0, done.stderr
    gpus = json.loads(done.stdout)
    assert [g["index"] for g in gpus] == list(range(8))
    assert (gpus[1]["memory_used_mib"], gpus[1]["processes"]) == (40321, [48211])
    assert calls(log) == [" ".join(c[1:]) for c in (QUERY_GPU, QUERY_APPS, LIST)]


def test_doctor_reads_the_driver_and_links_from_the_query_modes(tmp_path: Path) -> None:
    env, log = fake_smi(tmp_path)
    done = run_multigpu(["doctor", "--no-probe", "--json"], tmp_path, **env)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {f"{c['group']}/{c['name']}": c for c in json.loads(done.stdout)["checks"]}
    assert rows["cuda/driver"]["value"] == "570.86.15, supports CUDA 12.8 (from nvidia-smi)"
    assert rows["gpu/topology"]["value"] == "NV12 (NVLink) x28"
    assert rows["gpu/gpu 1"]["status"] == "WARN" and "processes 48211" in rows["gpu/gpu 1"]["value"]
    made = calls(log)
    assert "" not in made  # plain `nvidia-smi` (the human-readable page) is never run
    assert set(made) <= set(RECORDINGS), made

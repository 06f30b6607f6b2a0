"""``multigpu doctor`` as users run it: real processes, real gloo, real exit codes.

- on its own: every check, then its own 2-process all-reduce through the launcher (exit 0 here);
- a FAIL (a socket interface that does not exist) → the row names it and the exit code is 1;
- Docker's 64 MiB /dev/shm, made for real in a private mount namespace → the WARN and its fix;
- usage errors → one line and exit 2;
- under ``multigpu run --cpu 2``: every rank checks, they all-reduce across each other, rank 0
  alone prints the comparison;
- on two test hosts (network namespaces) whose interfaces have different MTUs → the comparison
  WARNs naming both nodes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from multigpu.cli.doctor import parse_doctor_args
from multigpu.errors import UsageError
from multigpu.testing.hosts import Host
from tests.launch._util import child_env, popen_multigpu, run_multigpu
from tests.multinode._util import c10d_args, host_env, wait_all
from tests.multinode.conftest import two_hosts  # noqa: F401  (the fixture)


def _rows(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{c['where']}{c['group']}/{c['name']}": c for c in doc["checks"]}


def test_doctor_checks_this_machine_and_proves_an_all_reduce(tmp_path: Path) -> None:
    done = run_multigpu(["doctor", "--json"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    rows = _rows(doc)
    assert doc["mode"] == "single" and doc["exit_code"] == 0
    assert sum(doc["summary"].values()) == len(doc["checks"]) and doc["summary"]["FAIL"] == 0
    for name in ("software/torch", "cpu/threads", "cpu//dev/shm", "network/lo", "launch/hostname"):
        assert rows[name]["status"] == "OK", rows[name]
    assert rows["launch/environment"]["value"] == "single process (no launcher detected)"
    probe = rows["process group/all-reduce"]
    assert probe["status"] == "OK", probe
    assert probe["value"].startswith("2 processes, gloo: sum correct on every rank")
    measured = probe["detail"]["rows"]
    assert [r["size_bytes"] for r in measured] == [256 * 1024, 4 * 1024 * 1024]
    assert all(r["correct"] and r["busbw_gbps"] > 0 for r in measured)
    for row in doc["checks"]:
        assert (row["fix"] != "") == (row["status"] in ("WARN", "FAIL")), row
        assert "\n" not in row["value"] + row["fix"]


def test_a_missing_socket_interface_fails_naming_it_with_exit_code_1(tmp_path: Path) -> None:
    done = run_multigpu(["doctor", "--no-probe"], tmp_path, GLOO_SOCKET_IFNAME="does-not-exist0")
    assert done.returncode == 1, done.stdout + done.stderr
    line = next(ln for ln in done.stdout.splitlines() if "GLOO_SOCKET_IFNAME" in ln)
    assert "FAIL" in line and "does-not-exist0" in line, done.stdout
    assert "--no-probe was given" in done.stdout
    assert "1 FAIL" in done.stdout.splitlines()[-1]


@pytest.mark.requires("root", "command:unshare")
def test_dockers_64_mib_shm_warns_with_the_fix(tmp_path: Path) -> None:
    doctor = f"{sys.executable} -m multigpu doctor --no-probe --json"
    done = subprocess.run(
        ["unshare", "--mount", "sh", "-c", f"mount -t tmpfs -o size=64m shm /dev/shm && {doctor}"],
        env=child_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr  # a WARN does not fail the command
    shm = _rows(json.loads(done.stdout))["cpu//dev/shm"]
    assert shm["status"] == "WARN" and shm["value"].startswith("64 MiB"), shm
    assert "--shm-size" in shm["fix"]


def test_usage_errors_are_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = popen_multigpu(["doctor", "--backend", "mpi"], tmp_path)  # both children at once:
    helped = popen_multigpu(["doctor", "--help"], tmp_path)  # each mostly imports torch
    out, err = bad.communicate(timeout=120)
    assert bad.returncode == 2 and out == "", (out, err)
    assert err == (
        "multigpu: error: argument --backend: invalid choice: 'mpi' (choose from 'auto', "
        "'gloo', 'nccl'); see 'multigpu doctor --help'\n"
    )
    out, _ = helped.communicate(timeout=120)
    assert helped.returncode == 0 and out.startswith("usage: multigpu doctor [-h] [--json]")
    text = " ".join(out.split())
    assert "Exit code: 0 when nothing FAILs, 1 when something does, 2 for a usage error." in text


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--timeout", "0"], "argument --timeout: '0' is not valid; expected a number >= 1"),
        (["--nproc", "1"], "argument --nproc: '1' is not valid; expected an integer >= 2"),
        (["--gpus", "2"], "unrecognized arguments: --gpus 2"),
    ],
)
def test_bad_values_are_usage_errors_naming_the_option(argv: list[str], said: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_doctor_args(argv)
    assert str(caught.value) == f"{said}; see 'multigpu doctor --help'"


def test_under_the_launcher_every_rank_checks_and_rank_0_compares(tmp_path: Path) -> None:
    done = run_multigpu(["run", "--cpu", "2", "-m", "multigpu", "doctor", "--json"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)  # one document: rank 1 printed nothing
    assert doc["mode"] == "ranks" and doc["world_size"] == 2 and doc["exit_code"] == 0
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert doc["ranks"][0]["versions"] == doc["ranks"][1]["versions"]
    assert doc["ranks"][0]["iface"] == "lo"  # GLOO_SOCKET_IFNAME=lo, as the tests launch
    rows = _rows(doc)
    assert rows["launch/environment"]["value"].startswith("torchrun: rank 0 of 2")
    assert "launch/rendezvous port" not in rows  # the job's store holds it
    assert rows["process group/rendezvous"]["status"] == "OK"
    probe = rows["process group/all-reduce"]
    assert probe["status"] == "OK" and probe["value"].startswith("2 ranks, gloo: sum correct")
    assert rows["ranks/hosts"]["value"].endswith("(ranks 0, 1)")
    assert rows["ranks/versions"]["status"] == "OK" and rows["ranks/MTU"]["status"] == "OK"
    assert rows["cpu/threads"]["value"].startswith(f"{_cores()} cores; 2 process(es)")


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def test_two_nodes_with_different_mtus_warn_naming_both(
    two_hosts: list[Host],  # noqa: F811
    tmp_path: Path,
) -> None:
    node0, node1 = two_hosts
    ip = shutil.which("ip") or "ip"
    subprocess.run(
        [ip, "netns", "exec", node1.netns, ip, "link", "set", "eth0", "mtu", "1400"], check=True
    )
    procs = []
    for host in two_hosts:
        argv = ["run", "--cpu", "1", *c10d_args(node0), "--iface", host.interface,
                "-m", "multigpu", "doctor", "--json"]  # fmt: skip
        out_file, err_file = tmp_path / f"{host.name}.out", tmp_path / f"{host.name}.err"
        with out_file.open("wb") as out, err_file.open("wb") as err:
            procs.append(
                host.run([sys.executable, "-m", "multigpu", *argv], host_env(),
                         cwd=tmp_path, stdout=out, stderr=err)
            )  # fmt: skip
    ended = wait_all(procs, timeout=90)
    outs = [(tmp_path / f"{h.name}.out").read_text() for h in two_hosts]
    errs = [(tmp_path / f"{h.name}.err").read_text()[-3000:] for h in two_hosts]
    assert None not in ended and [p.returncode for p in procs] == [0, 0], errs
    printed = [out for out in outs if out]
    assert len(printed) == 1, outs  # rank 0 only, on whichever node c10d made node 0
    doc = json.loads(printed[0])
    rows = _rows(doc)
    assert doc["world_size"] == 2 and {r["host"] for r in doc["ranks"]} == {"node0", "node1"}
    assert rows["ranks/hosts"]["value"] in (
        "2 ranks: node0 (rank 0), node1 (rank 1)",
        "2 ranks: node1 (rank 0), node0 (rank 1)",
    )
    mtu = rows["ranks/MTU"]
    assert mtu["status"] == "WARN", mtu
    assert "1500 (eth0) on node0" in mtu["value"] and "1400 (eth0) on node1" in mtu["value"]
    assert rows["ranks/versions"]["status"] == "OK"
    assert rows["process group/all-reduce"]["status"] == "OK"
    assert rows["network/GLOO_SOCKET_IFNAME"]["value"].startswith("eth0: eth0 up")

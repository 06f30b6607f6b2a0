"""SLURM host lists and compressed tasks-per-node counts."""

from __future__ import annotations

import pytest

from multigpu.env.slurm import expand_nodelist, tasks_per_node
from multigpu.errors import EnvError


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node01", ["node01"]),
        ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
        ("a[1-2],b3", ["a1", "a2", "b3"]),
        ("gpu-[001-002]-ib", ["gpu-001-ib", "gpu-002-ib"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),
        ("n[08-11]", ["n08", "n09", "n10", "n11"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("login,c[1,3],gpu[2-3]", ["login", "c1", "c3", "gpu2", "gpu3"]),
        ("h[5]", ["h5"]),
        ("10.0.0.1,10.0.0.2", ["10.0.0.1", "10.0.0.2"]),
        ("GPUC960", ["GPUC960"]),
    ],
)
def test_expand_nodelist(text: str, hosts: list[str]) -> None:
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize(
    "text",
    ["", "node[1-2", "node1-2]", "node[[1-2]]", "a,,b", "n[3-1]", "n[a-b]", "n[]", "n[1-2,]"],
)
def test_malformed_nodelist_is_an_env_error(text: str) -> None:
    with pytest.raises(EnvError, match="host list") as info:
        expand_nodelist(text)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "counts"),
    [
        ("4", [4]),
        ("2(x2)", [2, 2]),
        ("2(x3),1", [2, 2, 2, 1]),
        ("1,3(x2),2", [1, 3, 3, 2]),
    ],
)
def test_tasks_per_node(text: str, counts: list[int]) -> None:
    assert tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["", "2(3)", "x2", "2(x)", "2,,1"])
def test_malformed_tasks_per_node(text: str) -> None:
    with pytest.raises(EnvError, match="tasks-per-node"):
        tasks_per_node(text)

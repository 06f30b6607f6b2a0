"""The mesh shape a user gives (``MeshShape``, ``mesh_shape=``, ``MULTIGPU_MESH``, a tensor
parallel size): its spellings, and every shape that cannot cover the world refused in one line
naming what to change — in ``multigpu.init`` before any process group or step, and in the
launcher before any worker starts (exit 2, nothing written)."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

import multigpu
from multigpu.errors import UsageError
from multigpu.launch.env_checks import check_worker_environment
from multigpu.launch.options import LaunchOptions
from multigpu.launch.plan import build_plan, request_devices
from multigpu.strategies import resolve_strategy
from tests.launch._util import run_multigpu

PLAN = {"ff.0": ColwiseParallel(), "ff.2": RowwiseParallel()}


def test_spellings_of_a_shape_mean_the_canonical_axes() -> None:
    shape = multigpu.MeshShape.parse("dp=2, tp=2").resolve(4)
    assert (shape.axis_names, shape.sizes) == (("dp_shard", "tp"), (2, 2))
    assert [shape.data_rank(r) for r in range(4)] == [0, 0, 1, 1] and shape.data_parallel == 2
    hsdp = multigpu.MeshShape.parse({"replicate": 2, "shard": -1}).resolve(8)
    assert (hsdp.axis_names, hsdp.sizes) == (("dp_replicate", "dp_shard"), (2, 4))
    assert multigpu.MeshShape.parse("tensor=4").resolve(8).sizes == (2, 4)


@pytest.mark.parametrize(
    ("spec", "world", "says"),
    [
        ("tp=3", 4, "mesh tp=3 (3 ranks) does not divide the world size 4"),
        ("dp=2,tp=2", 2, "= 4 ranks, but the world size is 2"),
        ("replicate=3", 4, "does not divide the world size 4"),
        ("dp=2,pp=2", 4, "'pp' is not a mesh axis"),
        ("tp=0", 4, "tp=0 is not a positive number of ranks"),
        ("dp=2,shard=2", 4, "dp_shard is given twice"),
        ("dp:2", 4, "is not axis=size"),
    ],
)
def test_a_shape_that_cannot_cover_the_world_is_one_line_naming_the_fix(
    spec: str, world: int, says: str
) -> None:
    with pytest.raises(UsageError) as info:
        multigpu.MeshShape.parse(spec).resolve(world)
    assert says in str(info.value) and "\n" not in str(info.value)
    assert "; " in str(info.value)  # what is wrong; what to change


def test_strategies_refuse_shapes_they_cannot_use() -> None:
    with pytest.raises(UsageError, match="has a tp axis, but strategy='fsdp' has no tensor"):
        multigpu.FSDPStrategy(mesh_shape="dp=2,tp=2")
    with pytest.raises(UsageError, match="gives the mesh twice"):
        multigpu.FSDPStrategy(replicate=2, mesh_shape="replicate=2")
    with pytest.raises(UsageError, match="expected a dict of submodule names"):
        multigpu.TensorParallelStrategy({}, tensor_parallel=2)
    with pytest.raises(UsageError, match="tp=0 is not a positive number"):
        multigpu.TensorParallelStrategy(PLAN, tensor_parallel=0)


def test_multigpu_mesh_shapes_fsdp_and_is_refused_where_no_mesh_is_used() -> None:
    env = {"MULTIGPU_MESH": "replicate=2"}
    fsdp = resolve_strategy("fsdp", 4, env)
    assert isinstance(fsdp, multigpu.FSDPStrategy) and fsdp.shape.dp_replicate == 2
    with pytest.raises(UsageError, match="MULTIGPU_MESH=replicate=2 .* strategy 'ddp' uses none"):
        resolve_strategy("ddp", 4, env)
    tp = multigpu.TensorParallelStrategy(PLAN, tensor_parallel=2)
    assert resolve_strategy(tp, 4, {"MULTIGPU_MESH": "dp=2,tp=2"}) is tp  # the same shape
    with pytest.raises(UsageError, match="differs from the mesh the script's strategy sets"):
        resolve_strategy(tp, 4, {"MULTIGPU_MESH": "tp=4"})


def test_init_refuses_a_tensor_parallel_size_the_world_cannot_hold_before_any_group() -> None:
    strategy = multigpu.TensorParallelStrategy(PLAN, tensor_parallel=2)
    with pytest.raises(UsageError, match="does not divide the world size 1"):
        multigpu.init(strategy=strategy, accelerator="cpu", environ={})


def test_the_launcher_refuses_a_mesh_its_world_cannot_hold_before_any_worker(
    tmp_path: Path,
) -> None:
    options = LaunchOptions(script="train.py", cpu=4)
    plan = build_plan(options, request_devices(options, gpu_count=0, cores=2), environ={}, cores=2)
    check_worker_environment(plan, {"MULTIGPU_MESH": "dp=2,tp=2"})
    with pytest.raises(UsageError, match="MULTIGPU_MESH=tp=3 .* does not divide the world size 4"):
        check_worker_environment(plan, {"MULTIGPU_MESH": "tp=3"})
    (tmp_path / "s.py").write_text("open('trained', 'w').close()\n")
    done = run_multigpu(["run", "--cpu", "2", "s.py"], tmp_path, MULTIGPU_MESH="tp=4")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "multigpu: error: MULTIGPU_MESH=tp=4 (from the environment): mesh tp=4 (4 ranks) does "
        "not divide the world size 2; choose sizes whose product divides 2 (or run a multiple "
        "of 4 processes)"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.py"]

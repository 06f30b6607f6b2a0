"""The estimate's formulas, to the byte, on small models built on the meta device."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from multigpu.errors import UsageError
from multigpu.estimate import Capacity, estimate_memory
from multigpu.estimate.memory import UNIT_BUFFERS

# Linear(1000, 1000) is an FSDP unit of its own (>= 100k parameters); Linear(1000, 10) stays in
# the root unit with everything else.
BIG, SMALL = 1000 * 1000 + 1000, 1000 * 10 + 10


def _net() -> nn.Module:
    with torch.device("meta"):
        return nn.Sequential(nn.Linear(1000, 1000), nn.ReLU(), nn.Linear(1000, 10))


def test_ddp_holds_params_grads_two_adam_states_and_the_buckets() -> None:
    est = estimate_memory(_net(), world_size=2, gradient_as_bucket_view=False)  # torch's default
    ddp = est.of("ddp")
    p = 4 * (BIG + SMALL)
    assert (ddp.params, ddp.grads, ddp.optimizer, ddp.buffers) == (p, p, 2 * p, p)
    assert ddp.total == ddp.device == 20 * est.parameters and ddp.host == 0
    assert est.units == (("0", BIG), ("", SMALL)) and est.largest_unit == BIG


def test_ddp_buckets_go_with_bucket_view_and_on_one_process() -> None:
    assert estimate_memory(_net(), world_size=2).of("ddp").buffers == 0  # multigpu's default
    assert estimate_memory(_net(), world_size=2, gradient_as_bucket_view=False).of(
        "ddp"
    ).buffers == 4 * (BIG + SMALL)
    assert estimate_memory(_net(), world_size=1).of("ddp").buffers == 0


def test_fsdp_shards_each_parameter_dim0_and_gathers_the_root_and_the_largest_unit() -> None:
    fsdp = estimate_memory(_net(), world_size=2).of("fsdp")
    # rows per rank: 500 of the 1000x1000 weight, 500 of its bias, 5 of the 10x1000, 5 of 10
    shard = 4 * (500 * 1000 + 500 + 5 * 1000 + 5)
    assert (fsdp.params, fsdp.grads, fsdp.optimizer) == (shard, shard, 2 * shard)
    # root gathered + its unsharded gradient, 3 float32 copies of the largest unit + its
    # float32 reduce-scatter input
    assert UNIT_BUFFERS == 3.0
    assert fsdp.buffers == 2 * 4 * SMALL + BIG * (3 * 4 + 4)
    assert fsdp.device == fsdp.total


def test_a_resume_holds_params_optimizer_and_the_largest_parameter_within_the_training() -> None:
    est = estimate_memory(_net(), world_size=2)
    p, largest = 4 * (BIG + SMALL), 4 * 1000 * 1000
    assert est.of("ddp").resume == p + 2 * p + largest  # no gradients, no second copy
    fsdp = est.of("fsdp")
    assert fsdp.resume == fsdp.params + fsdp.optimizer + largest
    with torch.device("meta"):
        one = nn.Linear(4096, 4096, bias=False)  # the largest parameter is the whole model
    models = (_net(), one, nn.Embedding(50, 8, device="meta"))
    for model in models:
        for world_size in (1, 2, 8):
            for device in ("cpu", "cuda"):
                for optimizer in ("adamw", "sgd", "sgd-momentum"):
                    est = estimate_memory(
                        model, world_size=world_size, device=device, optimizer=optimizer
                    )
                    for s in est.strategies:
                        trained = s.params + s.grads + s.optimizer + s.buffers
                        assert 0 < s.resume <= trained == s.total, (s, world_size, device)


def test_fsdp_pads_a_dim0_that_does_not_divide() -> None:
    with torch.device("meta"):
        net = nn.Linear(3, 10, bias=False)  # weight (10, 3): ceil(10 / 4) = 3 rows per rank
    assert estimate_memory(net, world_size=4, optimizer="sgd").of("fsdp").params == 3 * 3 * 4


def test_offload_moves_the_sharded_state_to_the_host() -> None:
    est = estimate_memory(_net(), world_size=2)
    fsdp, offload = est.of("fsdp"), est.of("fsdp+offload")
    assert offload.total == fsdp.total and offload.gpu_only and not fsdp.gpu_only
    assert offload.host == fsdp.params + fsdp.grads + fsdp.optimizer
    assert offload.device == fsdp.buffers


def test_bf16_mixed_keeps_float32_state_and_bf16_compute_copies() -> None:
    est = estimate_memory(_net(), world_size=2, precision="bf16-mixed")
    ddp, fsdp = est.of("ddp"), est.of("fsdp")
    count = BIG + SMALL
    assert ddp.params == 4 * count and ddp.buffers == 2 * count  # autocast's bf16 copies
    assert fsdp.params == estimate_memory(_net(), world_size=2).of("fsdp").params
    assert fsdp.buffers == 2 * 2 * SMALL + BIG * (3 * 2 + 4)  # bf16 gathered, f32 reduce


def test_bf16_parameters_halve_everything_sized_like_them() -> None:
    with torch.device("meta"):
        net = nn.Linear(1000, 1000).to(torch.bfloat16)
    ddp = estimate_memory(net, world_size=2).of("ddp")
    assert (ddp.params, ddp.optimizer) == (2 * BIG, 4 * BIG)


def test_module_buffers_count_with_the_parameters_and_shared_weights_once() -> None:
    with torch.device("meta"):
        net = nn.Sequential(nn.Linear(10, 10), nn.BatchNorm1d(10))
        tied = nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 10))
    tied[1].weight = tied[0].weight
    # running mean and var (float32) and num_batches_tracked (int64)
    assert estimate_memory(net, world_size=2).of("ddp").params == 4 * (110 + 20) + 4 * 20 + 8
    assert estimate_memory(tied, world_size=2).parameters == 100 + 10 + 10


@pytest.mark.parametrize(("optimizer", "states"), [("adam", 2), ("sgd", 0), ("sgd-momentum", 1)])
def test_optimizer_state_follows_the_optimizer(optimizer: str, states: int) -> None:
    est = estimate_memory(_net(), world_size=2, optimizer=optimizer)
    assert est.of("ddp").optimizer == states * 4 * (BIG + SMALL)
    assert est.states_per_param == states


def test_blocks_choose_the_units_as_fsdp_does() -> None:
    est = estimate_memory(_net(), world_size=2, blocks=[nn.Linear])
    assert est.units == (("0", BIG), ("2", SMALL), ("", 0))
    assert estimate_memory(_net(), world_size=2, min_block_params=10**7).units == (
        ("", BIG + SMALL),
    )


def test_a_model_already_on_the_cpu_counts_as_room_on_the_cpu_only() -> None:
    net = nn.Linear(100, 100)
    est = estimate_memory(net, world_size=2)
    assert (est.resident_bytes, est.resident_device) == (4 * 10_100, "cpu")
    assert est.room(Capacity(bytes=1000, source="x")) == 1000 + 4 * 10_100
    assert est.room(Capacity(bytes=1000, source="x", kind="cuda")) == 1000
    assert estimate_memory(_net(), world_size=2).resident_bytes == 0


def test_fits_compares_the_device_bytes_with_the_room() -> None:
    est = estimate_memory(_net(), world_size=2)
    ddp = est.of("ddp").device
    assert est.fits("ddp", Capacity(bytes=ddp, source="x")) is True
    assert est.fits("ddp", Capacity(bytes=ddp - 1, source="x")) is False
    assert est.fits("fsdp+offload", Capacity(bytes=ddp, source="x")) is None  # GPU only
    assert est.fits("fsdp+offload", Capacity(bytes=ddp, source="x", kind="cuda")) is True
    assert est.fits("ddp") is None  # no capacity given


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"world_size": 0}, "world_size=0; expected a positive number of processes"),
        ({"world_size": True}, "world_size=True"),
        ({"world_size": 2, "precision": "16-mixed"}, "precision='16-mixed'"),
        ({"world_size": 2, "optimizer": "lion"}, "optimizer 'lion' is not known"),
    ],
)
def test_bad_arguments_are_usage_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        estimate_memory(_net(), **kwargs)  # type: ignore[arg-type]


def test_to_json_and_table_say_every_strategy_and_what_is_left_out() -> None:
    est = estimate_memory(_net(), world_size=2, capacity=Capacity(bytes=2**30, source="test"))
    data = est.to_json()
    assert set(data["strategies"]) == {"ddp", "fsdp", "fsdp+offload"}
    assert set(data["strategies"]["fsdp"]) == {
        "params", "grads", "optimizer", "buffers", "total", "device", "host", "resume", "fits"
    }  # fmt: skip
    assert data["choice"]["strategy"] == "ddp" and data["capacity"]["source"] == "test"
    assert data["strategies"]["fsdp+offload"]["fits"] is None
    assert any("activations" in note for note in data["notes"])
    text = est.table()
    for row in ("ddp", "fsdp", "fsdp+offload", "strategy='auto' chooses ddp", "activations"):
        assert row in text, text


def test_the_step_temporaries_count_on_gpus_only_and_a_missing_device_is_said() -> None:
    p = 4 * (BIG + SMALL)
    on_gpu = estimate_memory(_net(), world_size=2, device="cuda")
    assert on_gpu.of("ddp").optimizer == 3 * p  # 2 states + foreach's sqrt list
    assert on_gpu.of("fsdp").optimizer == 3 * on_gpu.of("fsdp").grads
    assert on_gpu.of("fsdp+offload").optimizer == 2 * on_gpu.of("fsdp").grads  # steps on the host
    gpu_capacity = Capacity(bytes=2**34, source="GPU 0", kind="cuda")
    assert estimate_memory(_net(), world_size=2, capacity=gpu_capacity).of("ddp").optimizer == 3 * p
    sgd = estimate_memory(_net(), world_size=2, device="cuda", optimizer="sgd-momentum")
    assert sgd.of("ddp").optimizer == p  # in place: no temporaries
    on_cpu = estimate_memory(_net(), world_size=2, device=torch.device("cpu"))
    assert on_cpu.of("ddp").optimizer == 2 * p and len(on_cpu.notes) == 1
    unknown = estimate_memory(_net(), world_size=2)
    assert any("step's temporaries are not counted" in note for note in unknown.notes)

"""``strategy="auto"`` is one object from ``init`` to the end: it decides at ``ctx.setup`` and
delegates to what it chose; strategies the script made are never changed by the environment."""

from __future__ import annotations

from typing import Any

import pytest

from multigpu.strategies import AutoStrategy, DDPStrategy, FSDPStrategy, resolve_strategy
from multigpu.testing import run_distributed
from tests.strategies import auto_workers


@pytest.fixture(scope="module")
def chose_fsdp(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    directory = tmp_path_factory.mktemp("auto") / "ckpt"
    return run_distributed(
        auto_workers.one_object_through_the_choice, world_size=2, args=(str(directory),)
    )


def test_ctx_strategy_is_the_same_object_before_and_after_auto_chose_fsdp(
    chose_fsdp: list[dict[str, Any]],
) -> None:
    for result in chose_fsdp:
        assert result["name"] == "fsdp" and result["same"] is True


def test_a_loader_made_before_setup_follows_the_choice(chose_fsdp: list[dict[str, Any]]) -> None:
    # 6 samples, 2 per rank and batch, no padding: rank 0 has 2 batches, rank 1 one; under
    # FSDP (every forward a collective) rank 1 gets an empty second one.
    for result in chose_fsdp:
        assert (result["even_before"], result["even_after"]) == (False, True)
        assert result["batches"] == 2


def test_a_checkpointer_made_before_setup_names_fsdp_and_resumes(
    chose_fsdp: list[dict[str, Any]],
) -> None:
    for result in chose_fsdp:
        assert result["manifest"]["strategy"] == "fsdp"
        assert result["manifest"]["mesh"] == {"dp_shard": 2}
        assert (result["resumed_name"], result["resumed_step"]) == ("fsdp", 1)
    assert chose_fsdp[0]["resumed_equal"] is True  # the full state is gathered on rank 0


def test_auto_above_one_process_is_one_object_that_delegates() -> None:
    auto = resolve_strategy("auto", 2, {"MULTIGPU_COMPRESSION": "fp16"})
    assert isinstance(auto, AutoStrategy) and isinstance(auto.chosen, DDPStrategy)
    assert (auto.name, auto.describe()["compression"], auto.compression) == ("ddp", "fp16", "fp16")
    auto.decide(lambda: "fsdp")
    assert isinstance(auto.chosen, FSDPStrategy) and auto.describe()["strategy"] == "fsdp"
    assert auto.blocks is None and auto.forward_is_collective  # the chosen one's attributes
    auto.decide(lambda: "ddp")  # once: the first model decided
    assert auto.name == "fsdp"


def test_the_environment_changes_a_copy_of_the_scripts_strategy() -> None:
    ddp = DDPStrategy()
    got = resolve_strategy(ddp, 2, {"MULTIGPU_COMPRESSION": "bf16"})
    assert got is not ddp and got.describe()["compression"] == "bf16"
    assert ddp.compression is None and ddp.describe()["compression"] == "none"
    assert resolve_strategy(ddp, 2, {}) is ddp  # nothing to change: the object itself

    fsdp = FSDPStrategy()
    shaped = resolve_strategy(fsdp, 4, {"MULTIGPU_MESH": "replicate=2,shard=2"})
    assert isinstance(shaped, FSDPStrategy) and shaped is not fsdp
    assert shaped.shape.dp_replicate == 2 and fsdp.shape.dp_replicate == 1
    assert not fsdp.shape_given

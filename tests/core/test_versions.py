"""Every rank checks at start-up that all ranks run the same torch, Python and multigpu."""

from __future__ import annotations

from multigpu.testing import run_distributed


def _init_with_torch(version_on_rank_1: str) -> str:
    import os

    import torch

    import multigpu

    if os.environ["RANK"] == "1":
        torch.__version__ = version_on_rank_1  # type: ignore[assignment]  # as if installed
    try:
        with multigpu.init():
            return "started"
    except multigpu.EnvError as e:
        return str(e)


def test_a_rank_with_another_torch_stops_every_rank_with_one_message() -> None:
    import torch

    results = run_distributed(_init_with_torch, world_size=2, args=("2.12.1",))
    for message in results:
        assert f"torch {torch.__version__} on rank 0" in message
        assert "2.12.1 on rank 1" in message and "install the same versions" in message


def test_the_same_software_starts() -> None:
    import torch

    assert run_distributed(_init_with_torch, world_size=2, args=(torch.__version__,)) == [
        "started",
        "started",
    ]

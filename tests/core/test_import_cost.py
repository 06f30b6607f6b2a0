"""What a worker imports before it uses a feature: DCP and pipelining only when asked for.

``torch.distributed.checkpoint`` (with DTensor, FSDP and the elastic agent it pulls in) and
``torch.distributed.pipelining`` (with ``torch._dynamo``) cost about 1.5 s of CPU together in
every process that imports them: 3.5 s instead of 2.0 s for ``multigpu.init``'s modules,
measured with ``/usr/bin/time python -c "import multigpu.context, multigpu.initialize"`` on the
CI machine. A run that never checkpoints and is not pipelined must not pay it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch.distributed.checkpoint", "torch.distributed.pipelining", "torch._dynamo")


def _imported_after(code: str) -> set[str]:
    probe = f"{code}\nimport sys\nprint(' '.join(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    return set(done.stdout.split())


def test_a_ddp_run_without_checkpoints_imports_neither_dcp_nor_pipelining() -> None:
    code = (
        "import torch, multigpu\n"
        "with multigpu.init(strategy='ddp', seed=0) as ctx:\n"
        "    model = ctx.setup(torch.nn.Linear(2, 2))\n"
        "    ctx.loader(torch.utils.data.TensorDataset(torch.zeros(4, 2)), batch_size=2)\n"
    )
    imported = _imported_after(code)
    assert "multigpu.context" in imported  # the probe ran what a worker runs
    assert not {m for m in imported if m.startswith(HEAVY)}


@pytest.mark.parametrize(
    ("code", "needs"),
    [
        ("import multigpu; multigpu.Checkpointer", "torch.distributed.checkpoint.filesystem"),
        ("import multigpu.checkpoint; multigpu.checkpoint.load_weights", HEAVY[0]),
    ],
)
def test_the_checkpoint_names_still_import_dcp_when_used(code: str, needs: str) -> None:
    assert needs in _imported_after(code)  # the lazy names resolve (not a dead export)

"""What a worker imports before it uses a feature: DCP and pipelining only when asked for.

``torch.distributed.checkpoint`` (with DTensor, FSDP and the elastic agent it pulls in) and
``torch.distributed.pipelining`` (with ``torch._dynamo``) cost about 1.5 s of CPU together in
every process that imports them: 3.5 s instead of 2.0 s for ``multigpu.init``'s modules,
measured with ``/usr/bin/time python -c "import multigpu.context, multigpu.initialize"`` on the
CI machine (both in ``multigpu.session`` since). A run that never checkpoints and is not
pipelined must not pay it.
"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch.distributed.checkpoint", "torch.distributed.pipelining")

PROBE = """
import json, sys, torch, multigpu
def heavy():
    return sorted(m for m in sys.modules if m.startswith(HEAVY))
with multigpu.init(strategy="ddp", seed=0) as ctx:
    model = ctx.setup(torch.nn.Linear(2, 2))
    ctx.loader(torch.utils.data.TensorDataset(torch.zeros(4, 2)), batch_size=2)
    ran = heavy()
    multigpu.Checkpointer  # the lazy names still resolve, and import DCP then
    multigpu.checkpoint.load_weights
    context = "multigpu.session.context" in sys.modules
    print(json.dumps({"ran": ran, "asked": heavy(), "context": context}))
""".replace("HEAVY", repr(HEAVY))


def test_a_ddp_run_imports_dcp_only_when_a_checkpoint_name_is_used() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["context"]  # the probe ran what a worker runs
    assert found["ran"] == []
    assert "torch.distributed.checkpoint.filesystem" in found["asked"]
    assert not any(m.startswith(HEAVY[1]) for m in found["asked"])

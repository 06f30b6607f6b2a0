"""A script written for GPUs, run on CPU processes, is told why it cannot run there in one line
(``launch/worker_site/sitecustomize.py``); other errors keep their tracebacks."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

from tests.launch._util import SRC, run_multigpu

# The PyTorch DDP tutorial's torchrun example (elastic_ddp.py), unchanged but for its size.
TUTORIAL = """
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self):
        super(ToyModel, self).__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic():
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    print(f"Start running basic DDP example on rank {rank}.")
    device_id = rank % torch.cuda.device_count()
    model = ToyModel().to(device_id)
    ddp_model = DDP(model, device_ids=[device_id])
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5).to(device_id)
    loss_fn(outputs, labels).backward()
    optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    demo_basic()
"""


def test_the_ddp_tutorial_on_cpu_processes_ends_in_one_line_saying_why(tmp_path: Path) -> None:
    script = tmp_path / "elastic_ddp.py"
    script.write_text(TUTORIAL)
    done = run_multigpu(["run", "--cpu", "2", str(script)], tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr  # the script and the launch do not fit: usage
    assert len(lines) == 1, done.stderr  # before: two tracebacks, torch's warnings, a summary
    assert lines[0].startswith("multigpu: error: rank 0 on "), done.stderr
    assert "this run is on CPU processes (2 per node, no GPU)" in lines[0]
    assert "(Distributed package doesn't have NCCL built in)" in lines[0]
    assert 'use the "gloo" backend (dist.init_process_group("gloo"))' in lines[0]


def test_other_errors_keep_their_traceback_and_a_sitecustomize_of_the_users_still_runs(
    tmp_path: Path,
) -> None:
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text("import os\nos.environ['MINE'] = 'ran'\n")
    script = tmp_path / "boom.py"
    script.write_text(
        textwrap.dedent(
            """
            import os
            print("mine:", os.environ.get("MINE"))
            raise ValueError("boom")
            """
        )
    )
    path = os.pathsep.join([str(tmp_path / "site"), str(SRC)])
    done = run_multigpu(["run", "--cpu", "1", str(script)], tmp_path, PYTHONPATH=path)
    assert done.returncode == 1, done.stderr
    assert "mine: ran" in done.stdout, done.stdout
    assert "Traceback (most recent call last)" in done.stderr, done.stderr
    assert "ValueError: boom" in done.stderr, done.stderr

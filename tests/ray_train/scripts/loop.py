"""One training loop for Ray Train's TorchTrainer and `multigpu run --cpu 2` alike.

`train(config)` is the TorchTrainer's train function; `multigpu run --cpu 2 loop.py CONFIG_JSON`
runs the same. config: "out" (a directory: rank 0 writes losses.jsonl and final.pt there, every
rank facts-RANK-STEP.json as it starts at STEP; checkpoints go to out/ckpt), "log_to" and
"timeout" (multigpu.init's), "fail_at" (on the first attempt rank 1 exits at that step, as a
worker that died), "doctor" (each rank first runs `multigpu doctor --json --no-probe` into
out/doctor-RANK.json). `Reports` is a Ray callback that keeps what every worker reported.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import multigpu
from multigpu.torch_compat import group_timeout

STEPS = 60


def train(config: dict) -> None:
    out = Path(config["out"])
    if config.get("doctor"):  # as a user would, from the training function: Ray's variables
        rank = os.environ["RANK"]
        found = subprocess.run(
            [sys.executable, "-m", "multigpu", "doctor", "--json", "--no-probe"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        (out / f"doctor-{rank}.json").write_text(found.stdout or found.stderr)
    with multigpu.init(seed=0, log_to=config.get("log_to"), timeout=config.get("timeout")) as ctx:
        made = torch.Generator().manual_seed(1)
        data = TensorDataset(
            torch.randn(2048, 16, generator=made), torch.randint(0, 4, (2048,), generator=made)
        )
        model = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 4)
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        model, optimizer = ctx.setup(model, optimizer)
        loader = ctx.loader(data, batch_size=64)  # 32 steps an epoch: the run crosses one
        ckpt = ctx.checkpointer(
            out / "ckpt", every_steps=20, keep=2, model=model, optimizer=optimizer, loader=loader
        )
        ckpt.resume()
        facts = {
            "rank": ctx.rank,
            "device": str(ctx.device),
            "source": ctx.env.source,
            "timeout_s": group_timeout().total_seconds() if ctx.world_size > 1 else None,
            "resumed_at": ckpt.steps,
        }
        (out / f"facts-{ctx.rank}-{ckpt.steps}.json").write_text(json.dumps(facts))
        fail_at, first = config.get("fail_at"), not (out / "failed").exists()
        while ckpt.steps < STEPS:
            for x, y in loader:
                if ckpt.steps == fail_at and first and ctx.rank == 1:
                    (out / "failed").touch()
                    os._exit(1)  # a worker dies mid-run: no clean-up, no error raised
                loss = F.cross_entropy(model(x), y)
                ctx.backward(loss)
                ctx.step(optimizer)
                ckpt.step()
                mean = ctx.all_reduce(loss.item())
                ctx.log({"loss": mean}, step=ckpt.steps)
                if ctx.is_main:
                    with open(out / "losses.jsonl", "a") as f:
                        f.write(json.dumps({"step": ckpt.steps, "loss": mean}) + "\n")
                if ckpt.steps >= STEPS:
                    break
        if ctx.is_main:
            torch.save(ctx.unwrap(model).state_dict(), out / "final.pt")


if __name__ == "__main__":
    train(json.loads(sys.argv[1]))

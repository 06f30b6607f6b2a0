"""The loop shapes users write, for the replica-group tests and the chaos benchmark: nothing in
it knows of replicas.

``python loops.py OUT SHAPE SCHEDULE [STRATEGY]``:

- SHAPE ``readme``: README's ``for epoch in range(EPOCHS): for x, y in loader:`` with
  ``optimizer.step()``; ``ckpt``: a Checkpointer-bounded ``while ckpt.steps < STEPS``; ``while``:
  ``while loader.epoch < EPOCHS``. The last two step with ``ctx.step``.
- SCHEDULE ``none``, ``epoch`` (StepLR stepped after each pass) or ``step`` (StepLR stepped with
  each optimizer step: after ``optimizer.step()`` in ``readme``, when ``ctx.step`` returns True
  otherwise).
- STRATEGY ``ddp`` (default) or ``fsdp``.

Writes under OUT: ``pid-<group>-<rank>-<restart>`` at start, a line per stepped optimizer step to
``steps-<group>-<rank>`` (wall time, then the loader's global step), the final parameters to
``params-<group>-<rank>.pt`` (whole, from ``ctx.full_state_dict`` under FSDP) and, from the
process that is ``ctx.is_main``, its group to ``writers``. ``JOB_SLEEP`` paces a step;
``JOB_CKPT_EVERY=N`` checkpoints every N steps into OUT/ckpt and resumes from there (always on for
``ckpt``: every 10 steps by default). ``JOB_WAIT_AT=S`` and ``JOB_WAIT_FOR=PATH``: the groups of
``JOB_WAIT_GROUPS`` (default ``0``) stop at global step S until PATH exists (up to 180 s): a
test holds the survivor there until the killed group's next life has started; from there on,
while ``JOB_SLOW_UNTIL=PATH2`` does not exist, they sleep 1 s a step (still stepping: the
restarted group can join their quorum), so that its heal lands mid-run whatever the machine's
speed. ``JOB_PRECISION`` (default ``32``) is ``init``'s
precision and ``JOB_CLIP=X`` clips the gradient norm to X before ``ctx.step`` (``ckpt``, ``while``).
``JOB_DRIFT_AT=S``: group 1 nudges a weight after step S (what a bug would do; the groups' checks
must find it). ``JOB_DATA=stream``: the same samples as a ``torch.utils.data.IterableDataset``
(a stream, shuffled through the loader's buffer) instead of a ``TensorDataset``.
"""

import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import IterableDataset, TensorDataset

import multigpu

EPOCHS, STEPS_PER_EPOCH, BATCH = 4, 25, 16
STEPS = EPOCHS * STEPS_PER_EPOCH

out, shape, schedule = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
strategy = sys.argv[4] if len(sys.argv) > 4 else "ddp"


class Stream(IterableDataset):
    """The samples of a TensorDataset as a stream: read in order, no index."""

    def __init__(self, data: TensorDataset) -> None:
        self.data = data

    def __iter__(self):
        return (self.data[i] for i in range(len(self.data)))


pause = float(os.environ.get("JOB_SLEEP", "0"))
group = os.environ.get("MULTIGPU_REPLICA_GROUP", "plain")
every = int(os.environ.get("JOB_CKPT_EVERY", "10" if shape == "ckpt" else "0"))
precision = os.environ.get("JOB_PRECISION", "32")
clip = float(os.environ.get("JOB_CLIP", "0"))
with multigpu.init(seed=0, strategy=strategy, precision=precision) as ctx:
    tag = f"{group}-{ctx.rank}"
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    (out / f"pid-{tag}-{restart}").write_text(str(os.getpid()))
    g = torch.Generator().manual_seed(0)
    n = STEPS_PER_EPOCH * BATCH
    data = TensorDataset(torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g))
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 1)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = None
    if schedule == "epoch":
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    elif schedule == "step":
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.5)
    model, optimizer = ctx.setup(model, optimizer)
    if os.environ.get("JOB_DATA") == "stream":
        loader = ctx.loader(Stream(data), batch_size=BATCH, buffer_size=64)
    else:
        loader = ctx.loader(data, batch_size=BATCH)
    ckpt = None
    if every:
        ckpt = ctx.checkpointer(
            out / "ckpt", every_steps=every, model=model, optimizer=optimizer, loader=loader,
            **({"scheduler": scheduler} if scheduler is not None else {}),
        )  # fmt: skip
        ckpt.resume()
    steps = open(out / f"steps-{tag}", "a")  # noqa: SIM115 - written at every step of the loop

    wait_at = int(os.environ.get("JOB_WAIT_AT", "-1"))
    wait_for = Path(os.environ.get("JOB_WAIT_FOR", "/nonexistent"))
    waits = group in os.environ.get("JOB_WAIT_GROUPS", "0").split(",")
    slow_until = Path(os.environ.get("JOB_SLOW_UNTIL", "/nonexistent"))
    drift_at = int(os.environ.get("JOB_DRIFT_AT", "-1"))

    def stepped() -> None:
        position = loader.epoch * STEPS_PER_EPOCH + loader.state_dict()["cursor"] // BATCH
        steps.write(f"{time.time()} {position}\n")
        steps.flush()
        time.sleep(pause)
        if waits and position == wait_at:
            deadline = time.monotonic() + 180
            while not wait_for.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        if waits and position >= wait_at >= 0 and not slow_until.exists():
            time.sleep(1.0)
        if group == "1" and position == drift_at:
            with torch.no_grad():
                next(ctx.unwrap(model).parameters()).view(-1)[0] += 1e-3

    if shape == "readme":
        for epoch in range(EPOCHS):
            for x, y in loader:
                loss = F.mse_loss(model(x), y)
                optimizer.zero_grad()
                ctx.backward(loss)
                optimizer.step()
                if schedule == "step":
                    scheduler.step()
                if ckpt is not None:
                    ckpt.step()
                stepped()
            if schedule == "epoch":
                scheduler.step()
            ctx.print(f"epoch {epoch} loss {ctx.all_reduce(loss.item()):.4f}")
    elif shape in ("ckpt", "while"):
        while (ckpt.steps < STEPS) if shape == "ckpt" else (loader.epoch < EPOCHS):
            for x, y in loader:
                ctx.backward(F.mse_loss(model(x), y))
                if clip:
                    ctx.clip_grad_norm(model, optimizer, clip)
                if ctx.step(optimizer):
                    if schedule == "step":
                        scheduler.step()
                    if ckpt is not None:
                        ckpt.step()
                    stepped()
                if shape == "ckpt" and ckpt.steps >= STEPS:
                    break
            if schedule == "epoch":
                scheduler.step()
    else:
        raise SystemExit(f"unknown shape {shape!r}: readme, ckpt or while")
    steps.close()
    # The user's optimizer is the user's: no attribute or `step` of ours on it (issue 40); the
    # one `step` on the object is the LR scheduler's wrapper, which torch itself puts there.
    ours = sorted(k for k in vars(optimizer) if k.startswith("multigpu"))
    if "step" in vars(optimizer) and not hasattr(optimizer.step, "_wrapped_by_lr_sched"):
        ours.append("step")
    if ours:
        raise SystemExit(f"the optimizer carries attributes of multigpu's: {ours}")
    params = ctx.full_state_dict(model)
    if ctx.rank == 0:
        torch.save({k: v.detach().clone() for k, v in params.items()}, out / f"params-{tag}.pt")
    if ctx.is_main:
        with open(out / "writers", "a") as writers:
            writers.write(f"{group}\n")

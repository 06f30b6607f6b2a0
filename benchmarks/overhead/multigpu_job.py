"""(b) multigpu: multigpu.init + ctx.setup + ctx.loader + ctx.backward.

Run:  multigpu run --cpu 2 benchmarks/overhead/multigpu_job.py   (settings: see workload.py)

Environment variables read: what ``multigpu.init`` reads (torchrun's variables, ``MULTIGPU_*``)
and ``BENCH_*`` (see workload.py).
"""

from __future__ import annotations

import torch.nn.functional as F
import workload

import multigpu


def main() -> None:
    cfg = workload.settings()
    with multigpu.init(seed=cfg.seed) as ctx:
        model = workload.build_model(cfg)
        optimizer = workload.make_optimizer(model)
        model, optimizer = ctx.setup(model, optimizer)
        workload.require_data_parallel(cfg, model, "multigpu")
        # In order (see workload.py); drop_last as a training loader would.
        loader = ctx.loader(
            workload.build_dataset(cfg), batch_size=cfg.batch, shuffle=False, drop_last=True
        )
        clock = workload.StepClock(cfg.warmup)
        clock.start()
        while clock.steps < cfg.steps:
            for x, y in loader:  # epochs advance by themselves
                loss = F.cross_entropy(model(x), y)
                optimizer.zero_grad()
                ctx.backward(loss)
                optimizer.step()
                clock.tick(len(x))
                if clock.steps == cfg.steps:
                    break
        workload.write_result(cfg, "multigpu", clock, loss, model)


if __name__ == "__main__":
    main()

"""Worker functions (run_distributed pickles them) for saves without ``step()`` and for resumes
that load into the live tensors."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from tests.checkpoint.workers import BATCH, dataset


def _params(ctx: Any, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's whole tensors (gathered under FSDP: collective)."""
    from multigpu import torch_compat

    return {
        k: (v.full_tensor() if torch_compat.is_dtensor(v) else v).detach().clone()
        for k, v in ctx.unwrap(model).state_dict().items()
    }


def _tutorial(ctx: Any, directory: str, epochs: int, stop_after: int | None) -> dict[str, Any]:
    """The PyTorch DDP tutorial's loop with a Checkpointer: ``ckpt.save()`` after each epoch,
    never ``ckpt.step()``; the first epoch is where the resumed loader is."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = ctx.setup(model, optimizer)
    loader = ctx.loader(dataset(), batch_size=BATCH)
    ckpt = ctx.checkpointer(directory, model=model, optimizer=optimizer, loader=loader)
    ckpt.resume()
    start = loader.epoch
    saved = []
    for epoch in range(start, epochs):
        for x, _, y in loader:
            ctx.backward(F.cross_entropy(model(x), y))
            ctx.step(optimizer)
        path = ckpt.save()
        saved.append({"path": str(path), "epoch": epoch, "state": _params(ctx, model)})
        if stop_after is not None and epoch + 1 == stop_after:
            break
    again = ckpt.save()  # nothing moved since the last one
    result = {"start": start, "saved": saved, "again": str(again), "state": _params(ctx, model)}
    ckpt.close()
    return result


def tutorial_runs(runs: list[tuple[str, int, int | None]]) -> list[dict[str, Any]]:
    """``_tutorial(*run)`` for each run, one after the other in this process, each reseeded as
    ``init(seed=0)`` does (see ``workers.train_runs``)."""
    import multigpu
    from multigpu.runtime.seed import seed_everything

    with multigpu.init(seed=0) as ctx:
        results = []
        for run in runs:
            seed_everything(0)
            results.append(_tutorial(ctx, *run))
        return results


def tutorial_resumed(directory: str, epochs: int, paths: list[str]) -> dict[str, Any]:
    """Resume the tutorial's loop and finish it; then load each of ``paths`` again and report
    the model and the loader's epoch it holds."""
    import multigpu

    with multigpu.init(seed=0) as ctx:
        result = _tutorial(ctx, directory, epochs, None)
        model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        model, optimizer = ctx.setup(model, optimizer)
        loader = ctx.loader(dataset(), batch_size=BATCH)
        ckpt = ctx.checkpointer(directory, model=model, optimizer=optimizer, loader=loader)
        loaded = []
        for path in paths:
            ckpt.resume(path)
            loaded.append({"epoch": loader.epoch, "state": _params(ctx, model)})
        result["loaded"] = loaded
        return result


def _storages(tensors: Any) -> list[int]:
    """The data pointers of ``tensors``' own pieces (a DTensor's local one)."""
    from multigpu import torch_compat

    return [
        (t.to_local() if torch_compat.is_dtensor(t) else t).data_ptr()
        for t in tensors
        if isinstance(t, torch.Tensor) and t.dim() > 0
    ]


def _live_optimizer_state(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [
        value
        for group in optimizer.param_groups
        for p in group["params"]
        for value in optimizer.state[p].values()
    ]


def resume_in_place(strategy: str, directory: str, save: bool) -> dict[str, Any]:
    """Train 2 steps and save (``save``), or resume into a fresh model and optimizer and report
    whether the checkpoint was read into the tensors the model and the optimizer hold.

    The optimizer's ``load_state_dict`` pre-hook (torch's public one) sees the state about to be
    loaded, after DCP filled it: its tensors must be the optimizer's own (made before the load),
    so that no second copy of the state exists; the model's parameters must be the same storage
    before and after. Making the state is no training step: the optimizer's step hooks do not
    see it.
    """
    import multigpu

    with multigpu.init(strategy=strategy, seed=0) as ctx:
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5), torch.nn.Linear(5, 2)
        )
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
        model, optimizer = ctx.setup(model, optimizer)
        ckpt = ctx.checkpointer(directory, model=model, optimizer=optimizer)
        if save:
            for step in range(2):
                x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step + 10 * ctx.rank))
                ctx.backward(model(x).square().mean())
                ctx.step(optimizer)
                ckpt.step()
            ckpt.save()
            return {"state": _params(ctx, model), "optimizer": _optimizer_values(optimizer)}
        params = list(ctx.unwrap(model).parameters())
        before = _storages(params)
        seen: dict[str, Any] = {}

        def pre_hook(opt: torch.optim.Optimizer, state_dict: dict[str, Any]) -> None:
            loaded = [v for s in state_dict["state"].values() for v in s.values()]
            seen["loaded"] = _storages(loaded)
            seen["live"] = _storages(_live_optimizer_state(opt))

        optimizer.register_load_state_dict_pre_hook(pre_hook)
        stepped: list[int] = []  # what counts steps by hooks (DDP's allocator setting) sees
        optimizer.register_step_post_hook(lambda *_: stepped.append(1))
        ckpt.resume()
        return {
            "state": _params(ctx, model),
            "optimizer": _optimizer_values(optimizer),
            "params_before": before,
            "params_after": _storages(params),
            "optimizer_after": _storages(_live_optimizer_state(optimizer)),
            "hooked_steps": len(stepped),
            **seen,
        }


def _optimizer_values(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    from multigpu import torch_compat

    return [
        (t.full_tensor() if torch_compat.is_dtensor(t) else t).detach().clone()
        for t in _live_optimizer_state(optimizer)
    ]

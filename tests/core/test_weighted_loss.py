"""``ctx.backward(loss_sum, num_items=n)``: the gradient of the mean over every token of a step.

The reference is plain torch on one process: the whole global batch at once, its loss summed
and divided by its token count. Two gloo processes (DDP, FSDP, a pipeline; accumulation; the
user's own ``optimizer.step()`` and ``ctx.step``; clipping) must give it to float64 rounding,
and a per-micro-batch mean must not.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import multigpu
from multigpu.testing import run_distributed
from tests.core import loss_workers as w

PLAIN = {"MULTIGPU_DEVICE": "cpu"}
EXACT = 1e-12  # float64; measured ~2e-16


def relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(
        float((a[k].double() - b[k].double()).abs().max() / (b[k].double().abs().max() + 1e-12))
        for k in b
    )


@pytest.fixture(scope="module")
def pair() -> dict[str, dict[str, Any]]:
    return run_distributed(w.train_all, world_size=2, timeout=180)[0]


@pytest.mark.parametrize(("strategy", "loop", "accumulation", "clip"), w.RUNS)
def test_two_processes_give_the_one_process_whole_batch_result(
    pair: dict[str, dict[str, Any]], strategy: str, loop: str, accumulation: int, clip: Any
) -> None:
    ran = pair[f"{strategy}-{loop}-{accumulation}"]
    expected = w.reference(clip)
    assert relative_difference(w.model().state_dict(), expected["state"]) > 1e-2  # it trained
    diff = relative_difference(ran["state"], expected["state"])
    if loop == "naive":  # the mean of each micro-batch's mean: tokens weighted unequally
        assert diff > 1e-3, diff
        return
    assert diff <= EXACT, diff
    # The pipeline broadcasts its loss in float32; the others keep float64.
    tol = 1e-6 if strategy == "pipeline" else EXACT
    assert ran["losses"] == pytest.approx(expected["losses"], rel=tol)


@pytest.mark.parametrize(
    ("loop", "accumulation"), [("plain", 1), ("accumulate", 1), ("accumulate", 4)]
)
def test_one_process_with_accumulation_gives_the_whole_batch_result(
    loop: str, accumulation: int
) -> None:
    with multigpu.init(environ=PLAIN) as ctx:
        assert ctx.step_loss is None
        ran = w.train(ctx, loop, accumulation, w.MAX_NORM)
    expected = w.reference(w.MAX_NORM)
    assert relative_difference(ran["state"], expected["state"]) <= EXACT
    assert ran["losses"] == pytest.approx(expected["losses"], rel=EXACT)


def test_16_mixed_sums_stay_in_range_of_the_grad_scaler() -> None:
    """Each micro-batch's sum is divided by the last step's tokens per micro-batch before the
    scaled backward: only the first step overflows float16 (measured without it: 3 of 6)."""
    runs = []
    for accumulation in (1, 4):
        with multigpu.init(precision="16-mixed", environ=PLAIN) as ctx:
            net = w.model(torch.float32)
            model, opt = ctx.setup(net, torch.optim.SGD(net.parameters(), lr=w.LR))
            loader = ctx.loader(
                w.padded_data(), batch_size=w.GLOBAL_BATCH, accumulation_steps=accumulation
            )
            for _ in range(3):
                for x, y in loader:
                    with ctx.accumulate(model):
                        ctx.backward(w.loss_sum(model(x), y), num_items=w.items(y))
                        ctx.clip_grad_norm(model, opt, 1.0)
                        ctx.step(opt)
            scaler = ctx.precision.scaler
            assert scaler is not None and scaler.get_scale() == 2.0**15  # one skipped step
            runs.append({k: v.clone() for k, v in net.state_dict().items()})
    assert relative_difference(runs[1], runs[0]) <= 1e-3  # measured 1.5e-4


@pytest.mark.parametrize(
    ("num_items", "message"),
    [
        (True, r"num_items=True\) got a bool; expected the count"),
        ("12", r"got a str; expected the count"),
        (-1, r"num_items=-1\); expected a count >= 0"),
        (torch.ones(2), r"a tensor of shape \(2,\); expected one number"),
    ],
)
def test_bad_num_items_is_refused_in_one_line(num_items: Any, message: str) -> None:
    with multigpu.init(environ=PLAIN) as ctx:
        net = w.model()
        model = ctx.setup(net)
        x, y = w.padded_data()[:4]
        with pytest.raises(multigpu.UsageError, match=message):
            ctx.backward(w.loss_sum(model(x), y), num_items=num_items)


def test_num_items_on_some_micro_batches_of_a_step_only_is_refused() -> None:
    with multigpu.init(environ=PLAIN) as ctx:
        net = w.model()
        model, opt = ctx.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        loader = ctx.loader(w.padded_data(), batch_size=w.GLOBAL_BATCH, accumulation_steps=2)
        batches = iter(loader)
        for weighted_first in (True, False):
            for weighted in (weighted_first, not weighted_first):
                x, y = next(batches)
                with ctx.accumulate(model):
                    loss = w.loss_sum(model(x), y)
                    if weighted == weighted_first:
                        ctx.backward(loss, num_items=w.items(y) if weighted else None)
                        continue
                    with pytest.raises(multigpu.UsageError, match="num_items on .* micro-batch"):
                        ctx.backward(loss, num_items=w.items(y) if weighted else None)
            opt.zero_grad()


def test_num_items_without_a_set_up_model_is_refused() -> None:
    with multigpu.init(environ=PLAIN) as ctx:
        net = w.model()
        x, y = w.padded_data()[:4]
        with pytest.raises(multigpu.UsageError, match="no model was set up; call model, optim"):
            ctx.backward(w.loss_sum(net(x), y), num_items=w.items(y))


def test_a_second_weighted_backward_after_the_step_ended_is_refused_until_the_next_step() -> None:
    # Two backward calls on the micro-batch that ends a step: the first already rescaled the
    # gradients to its own count, so the second would be weighed apart (g1/16 + g2/4 was seen).
    with multigpu.init(environ=PLAIN) as ctx:
        net = w.model()
        model, opt = ctx.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        x, y = w.padded_data()[:8]
        for _ in range(2):  # no ctx.loader: the optimizer's own step starts the next step
            ctx.backward(w.loss_sum(model(x[:4]), y[:4]), num_items=w.items(y[:4]))
            with pytest.raises(multigpu.UsageError, match="once per micro-batch"):
                ctx.backward(w.loss_sum(model(x[4:]), y[4:]), num_items=w.items(y[4:]))
            opt.step()
            opt.zero_grad()

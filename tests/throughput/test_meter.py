"""The step meter and the collective-wait clock on one process, and ctx.throughput() under init."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import multigpu
from multigpu.examples.lm import build_model
from multigpu.runtime.collective_taps import Tap
from multigpu.throughput import StepMeter
from multigpu.throughput import meter as meter_module
from multigpu.throughput import wait as wait_module
from multigpu.throughput.wait import WaitClock

CPU = torch.device("cpu")


class Clock:
    """A stand-in for the ``time`` module of the meter and the wait clock: their arithmetic on
    exact spans. With real sleeps the bounds were about the scheduler, not the meter: on a
    loaded machine a sleeper waits for a core after its 10 ms, tens of ms more."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(meter_module, "time", fake)
    monkeypatch.setattr(wait_module, "time", fake)
    return fake


def test_a_step_lasts_from_the_previous_end_and_a_read_starts_a_new_window(clock: Clock) -> None:
    meter = StepMeter(CPU, 1)
    meter.batch()  # the first step starts at its batch
    clock.sleep(0.02)
    meter.work_began()
    meter.stepped(8)
    clock.sleep(0.03)  # between two steps (loading the next batch): counted
    meter.work_began()
    meter.stepped(8)
    first = meter.read("32")
    assert first["steps"] == 2
    assert first["step_seconds"] == pytest.approx(0.025)
    assert first["samples_per_second"] == pytest.approx(16 / 0.05)
    assert first["tokens_per_second"] is None and first["mfu"] is None
    assert first["collective_wait_share"] == 0.0  # one process waits on nobody
    assert first["peak_memory_bytes"] > 10 * 2**20  # this process's peak resident set
    clock.sleep(0.05)  # an evaluation after the read: not training time
    meter.batch()  # (the evaluation's batches, then the next training batch)
    clock.sleep(0.01)
    meter.batch()
    meter.work_began()
    clock.sleep(0.004)  # the step itself
    meter.stepped(4, tokens_per_sample=64)
    second = meter.read("32")
    assert second["steps"] == 1 and second["step_seconds"] == pytest.approx(0.004)
    assert second["tokens_per_second"] == pytest.approx(64 * second["samples_per_second"])
    assert meter.read("32")["step_seconds"] is None  # no step since


def test_the_wait_clock_counts_the_main_thread_once_per_call(clock: Clock) -> None:
    waits = WaitClock()
    space = SimpleNamespace(sleep=clock.sleep)
    space.nested = lambda: space.sleep(0.02)  # all_gather_object calls all_gather: once
    tap = Tap([(space, "sleep"), (space, "nested")])
    tap.listen(waits)
    space.nested()
    assert waits.seconds == pytest.approx(0.02)
    other = threading.Thread(target=space.sleep, args=(0.05,))  # not the step's wait
    other.start()
    other.join()
    assert clock.now == pytest.approx(1000.07) and waits.seconds == pytest.approx(0.02)
    tap.unlisten(waits)
    assert space.sleep == clock.sleep  # the function itself again
    space.sleep(0.01)
    assert waits.seconds == pytest.approx(0.02)


def test_flops_per_token_defaults_to_six_per_parameter_of_the_whole_model() -> None:
    meter = StepMeter(CPU, 1)
    assert meter.flops_per_token() is None  # nothing set up
    meter.note_model(nn.Linear(10, 10))
    assert meter.flops_per_token() == 6 * 110
    assert StepMeter(CPU, 1, flops_per_token=1e9).flops_per_token() == 1e9


def test_the_attention_term_takes_the_training_loaders_sequence_length() -> None:
    meter = StepMeter(CPU, 1)
    with torch.device("meta"):
        gpt = build_model()  # config: 4 layers, 128 wide
    meter.note_model(gpt)
    meter.stepped(32, tokens_per_sample=64)
    meter.read("32")  # after an evaluation whose loader has no tokens_per_sample
    meter.stepped(32)
    n = sum(p.numel() for p in gpt.parameters())
    assert meter.flops_per_token() == 6 * n + 12 * 4 * 128 * 64


def test_ctx_throughput_counts_the_loaders_samples_and_tokens_under_accumulation() -> None:
    ds = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    with multigpu.init(seed=0, environ={}) as ctx:
        model, optimizer = ctx.setup(nn.Linear(4, 2), torch.optim.SGD(nn.Linear(4, 2).parameters()))
        loader = ctx.loader(ds, batch_size=16, accumulation_steps=2, tokens_per_sample=32)
        for x, y in loader:
            with ctx.accumulate(model):
                ctx.backward(F.cross_entropy(model(x), y))
                ctx.step(optimizer)
        figures = ctx.throughput(across_ranks=True)
        with pytest.raises(multigpu.UsageError, match="tokens_per_sample=0.*whole number >= 1"):
            ctx.loader(ds, batch_size=16, tokens_per_sample=0)
    assert figures["steps"] == 4  # 64 samples, 16 per optimizer step (2 micro-batches each)
    assert figures["tokens_per_second"] == pytest.approx(32 * figures["samples_per_second"])
    assert figures["peak_memory_bytes_max"] == figures["peak_memory_bytes"]
    assert figures["collective_wait_share_max"] == 0.0


@pytest.mark.parametrize("bad", [0, -1.0, "6e9", float("nan")])
def test_init_refuses_a_flops_per_token_that_is_not_a_positive_number(bad: object) -> None:
    with pytest.raises(multigpu.UsageError, match="flops_per_token=.*expected a positive number"):
        multigpu.init(flops_per_token=bad, environ={})  # type: ignore[arg-type]


def test_ctx_throughput_measures_the_readmes_loop_of_optimizer_step(clock: Clock) -> None:
    # The README's loop steps the optimizer itself: no ctx.step. Every figure was None.
    ds = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    with multigpu.init(seed=0, environ={}) as ctx:
        model = nn.Linear(4, 2)
        model, optimizer = ctx.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
        loader = ctx.loader(ds, batch_size=16, tokens_per_sample=8)
        for x, y in loader:
            clock.sleep(0.01)  # the forward pass
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            ctx.backward(loss)
            clock.sleep(0.02)  # the backward pass
            optimizer.step()
        figures = ctx.throughput()
        second = torch.optim.SGD(model.parameters(), lr=0.1)  # not given to setup: not counted
        for x, y in loader:
            ctx.backward(F.cross_entropy(model(x), y))
            clock.sleep(0.04)
            ctx.step(optimizer, second)  # counted once, by ctx.step
        again = ctx.throughput()
    assert figures["steps"] == 4 and figures["step_seconds"] == pytest.approx(0.03)
    assert figures["samples_per_second"] == pytest.approx(16 / 0.03)
    assert figures["tokens_per_second"] == pytest.approx(8 * 16 / 0.03)
    assert again["steps"] == 4 and again["step_seconds"] == pytest.approx(0.04)


def test_the_trackers_start_up_is_not_counted_as_training(
    clock: Clock, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    # W&B's and MLflow's start-up, in the first ctx.log: 2,425 tokens/s were shown for the
    # first window against 5,296 measured (--log-to mlflow,wandb).
    import time
    import types

    from multigpu.instruments.tracking import dispatch
    from multigpu.instruments.tracking.to_csv import CsvTracker

    monkeypatch.setattr(dispatch, "time", types.SimpleNamespace(
        perf_counter=clock.perf_counter, time=time.time, monotonic=time.monotonic))  # fmt: skip
    opened = CsvTracker.open

    def slow_open(self: CsvTracker, opening: object) -> object:
        clock.sleep(3.0)
        return opened(self, opening)  # type: ignore[arg-type]

    monkeypatch.setattr(CsvTracker, "open", slow_open)
    ds = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    with multigpu.init(seed=0, environ={}, log_to="csv", log_dir=tmp_path) as ctx:
        model = nn.Linear(4, 2)
        model, optimizer = ctx.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
        for step, (x, y) in enumerate(ctx.loader(ds, batch_size=16), 1):
            ctx.backward(F.cross_entropy(model(x), y))
            clock.sleep(0.05)
            ctx.step(optimizer)
            ctx.log({"step": step}, step=step)  # the first opens the run: 3 s
        figures = ctx.throughput()
    assert figures["steps"] == 4 and figures["step_seconds"] == pytest.approx(0.05)

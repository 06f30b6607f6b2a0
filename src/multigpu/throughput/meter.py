"""The step meter behind ``ctx.throughput()``: step time, samples/s, tokens/s, collective wait,
peak memory and MFU over the optimizer steps since the last read.

The optimizer step (``multigpu.session.step``) feeds it: a loader's batch (``batch``), the start
of a forward/backward (``work_began``), the end of a backward (``backward_ended``) and each
optimizer step that stepped (``stepped``).
A step lasts from the end of the previous one to its own end — data loading, a checkpoint save
between steps and the optimizer included — except the first step after a read (or the first of
the run), which starts when the micro-batch of its first forward/backward was handed out, so
that an evaluation or a progress line between two steps is not counted as training; and the
trackers' start-up in the first ``ctx.log`` (``exclude``: seconds of W&B's or MLflow's) is left
out of the step it fell in.

Nothing here synchronises a GPU during a step: on CUDA the window's end waits for the GPU once,
at the read (so its time is the GPU's), and DDP's wait is read from CUDA events then.
"""

from __future__ import annotations

import logging
import resource
import sys
import time
from typing import Any

import torch
from torch import nn

from multigpu.common.log import warn_once
from multigpu.throughput import peak as peaks
from multigpu.throughput.wait import DDPTail, WaitClock, install, uninstall

log = logging.getLogger(__name__)


def peak_memory_bytes(device: torch.device) -> int:
    """This process's peak memory: CUDA's peak allocated bytes on a GPU, else the peak resident
    set size of the process (``getrusage``: the CPU has no allocator statistics)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # Linux counts KiB


def model_shape(model: nn.Module) -> tuple[int | None, int | None]:
    """(layers, width) from a model's ``config`` (nanoGPT's ``n_layer``/``n_embd`` or Hugging
    Face's ``num_hidden_layers``/``hidden_size``), for the attention term; (None, None) else."""
    config = getattr(model, "config", None)
    for layers, width in (("n_layer", "n_embd"), ("num_hidden_layers", "hidden_size")):
        a, b = getattr(config, layers, None), getattr(config, width, None)
        if isinstance(a, int) and isinstance(b, int):
            return a, b
    return None, None


class StepMeter:
    """One Context's meter (see the module doc)."""

    def __init__(
        self, device: torch.device, world_size: int, *, flops_per_token: float | None = None
    ) -> None:
        self.device, self.world_size = device, world_size
        self.given_flops = flops_per_token
        self._params = 0
        self._shape: tuple[int | None, int | None] = (None, None)
        self._clock: WaitClock | None = install() if world_size > 1 else None
        self._timing = self._clock is not None  # until close()
        self._ddp: DDPTail | None = None
        self._seq_len: int | None = None  # the tokens of a sample of the loader that fed a step
        self._reset()

    def _reset(self) -> None:
        self._start: float | None = None  # the step in progress: since when (None: not begun)
        self._candidate: float | None = None  # the latest batch's hand-out, before any work
        self._steps = 0
        self._seconds = 0.0
        self._samples = 0
        self._tokens = 0
        self._wait = 0.0  # the window's steps' Python-level waits
        self._wait_mark = self._thread_wait()  # at the start of the step in progress
        self._ddp_at = self._ddp_wait()  # at the read (on CUDA: waits for the events)
        self._gpu: list[torch.cuda.Event] = []  # CUDA: the window's first start, latest end
        self._gpu_outside = 0.0  # seconds left out (``exclude``) since the window's first start

    def _thread_wait(self) -> float:
        """The main thread's time in Python-level collectives so far (not on CUDA: the thread
        does not wait on NCCL there)."""
        if self._clock is None or self.device.type == "cuda":
            return 0.0
        return self._clock.seconds

    def _ddp_wait(self) -> float:
        """DDP's all-reduce tails so far (they happen inside backward, so inside a step)."""
        return self._ddp.seconds() if self._ddp is not None else 0.0

    # ---- what the Context feeds --------------------------------------------------------------
    def note_model(self, model: nn.Module) -> None:
        """The model given to ``ctx.setup``, before wrapping: its parameters (each once, tied
        ones too) set the default FLOPs per token."""
        self._params += sum(p.numel() for p in model.parameters())
        if self._shape == (None, None):
            self._shape = model_shape(model)

    def note_wrapped(self, model: nn.Module, strategy: str) -> None:
        """The wrapped model: under DDP, its gradients' hooks time the all-reduce's tail."""
        if strategy == "ddp" and self.world_size > 1 and self._ddp is None:
            self._ddp = DDPTail(model, cuda=self.device.type == "cuda")
            self._wait = 0.0  # the window's steps' Python-level waits
        self._wait_mark = self._thread_wait()  # at the start of the step in progress
        self._ddp_at = self._ddp_wait()  # at the read (on CUDA: waits for the events)

    def close(self) -> None:
        """The Context ends: the collectives are no longer timed (``wait.uninstall``), DDP's
        gradients no longer hooked. What was measured stays readable."""
        if self._timing:
            self._timing = False
            uninstall()
        if self._ddp is not None:
            self._ddp.remove()

    def batch(self) -> None:
        """A Context-made loader handed out a batch."""
        if self._start is None:
            self._candidate = time.perf_counter()

    def work_began(self) -> None:
        """A forward/backward begins (``ctx.backward``, ``ctx.forward_backward``)."""
        if self._start is None:
            self._start = self._candidate or time.perf_counter()
            self._wait_mark = self._thread_wait()  # collectives before (evaluation) not counted
            self._gpu_mark(0)

    def _gpu_mark(self, index: int) -> None:
        """On CUDA, an event on the current stream: 0 the window's first step start, 1 the
        latest step end (re-recorded; nothing waits for it before the read)."""
        if self.device.type != "cuda" or len(self._gpu) < index:
            return
        if len(self._gpu) == index:
            self._gpu.append(torch.cuda.Event(enable_timing=True))
        self._gpu[index].record()

    def exclude(self, seconds: float) -> None:
        """The last ``seconds`` were no part of training (a tracker's start-up, in the first
        ``ctx.log``): the step in progress does not count them."""
        if self._start is not None:
            self._start += seconds
            if self._gpu:  # the GPU idled meanwhile, inside the window the events span
                self._gpu_outside += seconds
        elif self._candidate is not None:
            self._candidate += seconds

    def backward_ended(self) -> None:
        """``ctx.backward`` returned."""
        if self._ddp is not None:
            self._ddp.backward_ended()

    def stepped(self, samples: int, tokens_per_sample: int | None = None) -> None:
        """An optimizer step ended, having consumed ``samples`` over all ranks, of
        ``tokens_per_sample`` tokens each (None: not said)."""
        tokens = samples * (tokens_per_sample or 0)
        if tokens_per_sample:  # kept for the attention term (an evaluation loader may follow)
            self._seq_len = tokens_per_sample
        now = time.perf_counter()
        if self._start is None:
            self._start = self._candidate or now
        self._seconds += now - self._start
        waited = self._thread_wait()
        self._wait += waited - self._wait_mark
        self._wait_mark = waited
        self._steps += 1
        self._samples += samples
        self._tokens += tokens
        self._start, self._candidate = now, None  # the next step starts here
        if self._gpu:
            self._gpu_mark(1)

    # ---- the read ----------------------------------------------------------------------------
    def flops_per_token(self) -> float | None:
        """The figure given, else 6 x parameters (+ attention when the shape and the training
        loader's ``tokens_per_sample`` are known)."""
        if self.given_flops is not None:
            return self.given_flops
        if not self._params:
            return None
        layers, width = self._shape
        return peaks.flops_per_token(
            self._params, layers=layers, width=width, seq_len=self._seq_len
        )

    def read(self, precision: str) -> dict[str, Any]:
        """The window's figures (see ``Context.throughput``), and a new window begins."""
        if len(self._gpu) == 2:  # CUDA: the GPU's time from the first step's start to the last end
            self._gpu[1].synchronize()
            self._seconds = self._gpu[0].elapsed_time(self._gpu[1]) / 1e3 - self._gpu_outside
        wait = self._wait + self._ddp_wait() - self._ddp_at
        steps, seconds = self._steps, self._seconds
        figures: dict[str, Any] = {
            "steps": steps,
            "step_seconds": seconds / steps if steps else None,
            "samples_per_second": self._samples / seconds if seconds > 0 else None,
            "tokens_per_second": self._tokens / seconds if seconds > 0 and self._tokens else None,
            "collective_wait_share": self._share(wait, seconds),
            "peak_memory_bytes": peak_memory_bytes(self.device),
            "mfu": None,
        }
        if self.device.type == "cuda" and figures["tokens_per_second"] is not None:
            figures["mfu"] = self._mfu(figures["tokens_per_second"], precision)
        self._reset()
        return figures

    def _share(self, wait: float, seconds: float) -> float | None:
        if self.world_size < 2:
            return 0.0 if seconds > 0 else None
        if seconds <= 0:
            return None
        if self.device.type == "cuda" and (self._ddp is None or not self._ddp.cuda):
            return None  # NCCL calls return at once: the thread's time is not the wait
        return min(1.0, wait / seconds)

    def _mfu(self, tokens_per_second: float, precision: str) -> float | None:
        name = torch.cuda.get_device_name(self.device)
        found = peaks.find_peak(name)
        per_token = self.flops_per_token()
        if found is None:
            warn_once(
                log,
                "MFU: %s is not in multigpu's table of peak FLOP/s "
                "(multigpu.throughput.peak.PEAKS); MFU is reported as None",
                name,
            )
            return None
        if per_token is None:
            return None
        tf32 = torch.get_float32_matmul_precision() != "highest"
        return peaks.mfu(
            tokens_per_second, per_token, peaks.peak_flops(found, precision, tf32_allowed=tf32),
            self.world_size,
        )  # fmt: skip

"""The estimate against a real process's memory: one process training, its peak RSS growth."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# glibc's fixed mmap threshold: freed tensors go back to the OS at once, so the peak RSS follows
# the live tensors (with its dynamic default, freed blocks stay in the heap and the peak depends
# on the order of allocations: see benchmarks/RESULTS.md).
TRAIN = """
import ctypes, sys
ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024)
import torch
from torch import nn
from multigpu.estimate import estimate_memory
torch.set_num_threads(1)

def status(field):
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024

def make_optimizer(params):
    if sys.argv[1] == "adamw":
        return torch.optim.AdamW(params)
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)

# torch's first optimizer step imports torch._dynamo (~30 MiB of modules): not the model's memory
tiny = nn.Linear(2, 2)
tiny(torch.randn(1, 2)).sum().backward()
make_optimizer(tiny.parameters()).step()
before = status("VmRSS")
with open("/proc/self/clear_refs", "w") as fh:
    fh.write("5")  # the high-water mark starts here
net = nn.Sequential(*(nn.Linear(2048, 2048) for _ in range(4)))  # 16.8M parameters, 64 MiB
opt = make_optimizer(net.parameters())
for _ in range(2):
    net(torch.randn(4, 2048)).square().mean().backward()
    opt.step()
    opt.zero_grad()
estimate = estimate_memory(net, world_size=1, optimizer=opt, device="cpu").of("ddp").total
print(estimate / (status("VmHWM") - before))
"""


@pytest.mark.parametrize("optimizer", ["adamw", "sgd-momentum"])
def test_the_estimate_is_within_30_percent_under_the_peak_rss_of_a_real_run(optimizer: str) -> None:
    # Measured here: 0.78 (AdamW: 256 of 329 MiB) and 0.83 (SGD: 192 of 231 MiB), the rest
    # being the step's per-tensor temporaries and torch's own first-use allocations, which the
    # estimate leaves out. The estimate must not count more than is there, nor miss a term
    # (without the optimizer state AdamW's would be 0.39).
    out = subprocess.run(
        [sys.executable, "-c", TRAIN, optimizer], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    ratio = float(out.stdout.strip())
    assert 0.7 <= ratio <= 1.0, ratio


RESUME = """
import ctypes, sys
ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024)
import torch
from torch import nn
import multigpu
from multigpu.estimate import estimate_memory
torch.set_num_threads(1)
directory, mode = sys.argv[1], sys.argv[2]

def status(field):
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024

def build():
    torch.manual_seed(0)
    net = nn.Sequential(*(nn.Linear(2048, 2048) for _ in range(4)))  # 16.8M parameters, 64 MiB
    return net, torch.optim.AdamW(net.parameters())

with multigpu.init(seed=0, accelerator="cpu", environ={}) as ctx:
    # A first save and resume of a tiny model imports DCP and torch's first-use state: not the
    # model's memory.
    tiny = nn.Linear(2, 2)
    tiny_opt = torch.optim.AdamW(tiny.parameters())
    tiny(torch.randn(1, 2)).sum().backward()
    tiny_opt.step()
    small = ctx.checkpointer(directory + "-tiny", model=tiny, optimizer=tiny_opt)
    small.save()
    small.resume()
    small.close()
    if mode == "train":
        net, opt = build()
        net, opt = ctx.setup(net, opt)
        for _ in range(2):
            ctx.backward(net(torch.randn(4, 2048)).square().mean())
            ctx.step(opt)
        ctx.checkpointer(directory, model=net, optimizer=opt).save()
        sys.exit(0)
    before = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # the high-water mark starts here
    net, opt = build()
    net, opt = ctx.setup(net, opt)
    assert ctx.checkpointer(directory, model=net, optimizer=opt).resume() == 0
    estimate = estimate_memory(net, world_size=1, optimizer=opt, device="cpu").of("ddp").resume
    print(estimate / (status("VmHWM") - before))
"""


def test_the_resume_estimate_is_within_30_percent_under_the_peak_rss_of_a_real_resume(
    tmp_path: Path,
) -> None:
    # A resume holds the model (64 MiB), AdamW's state (128 MiB) and one buffer as large as the
    # largest parameter (16 MiB: the zero gradients the state is made with, then the tensor DCP
    # reads); a second copy of the model or of the state would put the ratio near 0.7 or 0.5.
    directory = str(tmp_path / "ckpt")
    for mode in ("train", "resume"):
        out = subprocess.run(
            [sys.executable, "-c", RESUME, directory, mode],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert out.returncode == 0, out.stderr
    ratio = float(out.stdout.strip().splitlines()[-1])
    assert 0.8 <= ratio <= 1.0, ratio

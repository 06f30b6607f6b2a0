"""FSDP and DDP on CPU workers keep large freed blocks with oneTBB's allocator, and give them back.

Real workers of ``multigpu run --cpu 2`` (oneTBB's allocator preloaded by the launcher): a block
of 64 MiB made and freed again and again is faulted in every time by default, not at all while a
sharded model is set up (DDP: from its second optimizer step on), and every time again after the
Context's teardown.
"""

from __future__ import annotations

import json
from pathlib import Path

from multigpu.runtime import tbb_malloc
from tests.launch._util import run_multigpu

SCRIPT = """
import json, os, sys
import torch
import multigpu
from multigpu.runtime import tbb_malloc

def faults():
    return int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[7])

def cycle():  # page faults of three 64 MiB blocks made, written and freed in turn
    before = faults()
    for _ in range(3):
        block = torch.empty(16 << 20)
        block.fill_(1.0)
        del block
    return faults() - before

seen = {"tbbmalloc": tbb_malloc.loaded_tbbmalloc() is not None, "default": cycle()}
ctx = multigpu.init(strategy=sys.argv[2])
net = torch.nn.Linear(64, 64)
model, opt = ctx.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
cycle()  # the first block is mapped once
seen["set_up"] = cycle()
for _ in range(2):
    ctx.backward(model(torch.randn(4, 64)).square().mean())
    opt.step()
    opt.zero_grad()
cycle()
seen["trained"] = cycle()
ctx.teardown()
seen["after"] = cycle()
open(os.path.join(sys.argv[1], f"rank{ctx.rank}.json"), "w").write(json.dumps(seen))
"""

PAGES = (64 << 20) // 4096


def run(tmp_path: Path, strategy: str) -> list[dict[str, object]]:
    script = tmp_path / "blocks.py"
    script.write_text(SCRIPT)
    result = run_multigpu(["run", "--cpu", "2", str(script), str(tmp_path), strategy], tmp_path)
    assert result.returncode == 0, result.stderr
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_fsdp_keeps_large_blocks_while_set_up_and_gives_them_back(tmp_path: Path) -> None:
    for seen in run(tmp_path, "fsdp"):
        assert seen["tbbmalloc"] is True
        # Three fresh mappings by default, none while FSDP is set up, three again afterwards.
        assert seen["default"] >= 3 * PAGES, seen
        assert seen["set_up"] < PAGES // 8 and seen["trained"] < PAGES // 8, seen
        assert seen["after"] >= 3 * PAGES, seen


def test_ddp_keeps_them_from_its_second_step_on(tmp_path: Path) -> None:
    # Not before: DDP's first buckets, freed when it rebuilds them, would stay kept for good.
    for seen in run(tmp_path, "ddp"):
        assert seen["tbbmalloc"] is True and seen["set_up"] >= 3 * PAGES, seen
        assert seen["trained"] < PAGES // 8, seen
        assert seen["after"] >= 3 * PAGES, seen


def test_without_tbbmalloc_nothing_is_set() -> None:
    # The test process runs on glibc's malloc: no library, no undo.
    assert tbb_malloc.loaded_tbbmalloc() is None
    assert tbb_malloc.keep_large_blocks() is None

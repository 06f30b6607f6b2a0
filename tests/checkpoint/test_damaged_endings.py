"""``ctx.load`` of a damaged checkpoint under ``multigpu run --cpu 2``: one line, the cause first
(it was 33 lines for a truncated or corrupt shard of ours, 168 for a plain DCP directory missing a
shard, 160 for one whose shard DCP cannot unpickle, 56 for a truncated safetensors file: both
ranks' tracebacks), as a mismatched one is."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

import multigpu
from tests.launch._util import popen_multigpu

SCRIPT = Path(__file__).resolve().parent / "scripts" / "load_given.py"


def _damaged(root: Path) -> dict[str, Path]:
    """Checkpoints of the script's model, each damaged its own way (and one whole)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    with multigpu.init(seed=0, accelerator="cpu", environ={}) as ctx:
        ctx.save(root / "whole", {"model": model})
    names = ("truncated", "corrupt", "dcp", "dcp_corrupt", "hub.safetensors")
    paths = {name: root / name for name in names}
    for name in ("truncated", "corrupt"):
        shutil.copytree(root / "whole", paths[name])
    shard = paths["truncated"] / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])
    shard = paths["corrupt"] / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum tells
    shard.write_bytes(bytes(data))
    dcp.save({"model": model.state_dict()}, checkpoint_id=paths["dcp"], no_dist=True)
    shutil.copytree(paths["dcp"], paths["dcp_corrupt"])
    os.remove(paths["dcp"] / "__0_0.distcp")
    shard = paths["dcp_corrupt"] / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[:64] = bytes(64)  # as long as the index says: DCP's unpickling of a piece tells
    shard.write_bytes(bytes(data))
    from safetensors.torch import save

    data = save({k: v.contiguous() for k, v in model.state_dict().items()})
    paths["hub.safetensors"].write_bytes(data[:-100])
    return paths


def test_a_damaged_checkpoint_ends_the_run_in_one_line_naming_the_cause(tmp_path: Path) -> None:
    paths = _damaged(tmp_path)
    runs = {name: [str(SCRIPT), str(path)] for name, path in paths.items()}
    runs["mismatched"] = [str(SCRIPT), str(tmp_path / "whole"), "32"]  # as before: one line
    procs = {n: popen_multigpu(["run", "--cpu", "2", *argv], tmp_path) for n, argv in runs.items()}
    done = {n: (p, *p.communicate(timeout=180)) for n, p in procs.items()}
    host = socket.gethostname()
    unreadable = "CheckpointUnreadableError: "
    causes = {
        "truncated": f"{unreadable}checkpoint {paths['truncated']} is not usable: __0_0.distcp: "
        "100 bytes, the manifest says",
        "corrupt": f"{unreadable}checkpoint {paths['corrupt']} is not usable: __0_0.distcp: "
        "SHA-256 differs from the manifest (corrupt)",
        "dcp": f"{unreadable}the DCP checkpoint {paths['dcp']} is incomplete: __0_0.distcp: "
        "missing (the index puts pieces in it)",
        "dcp_corrupt": f"{unreadable}cannot read {paths['dcp_corrupt']}: UnpicklingError: ",
        "hub.safetensors": f"{unreadable}{paths['hub.safetensors']} is not a readable "
        "safetensors file (SafetensorError: ",
        "mismatched": f"CheckpointMismatchError: checkpoint {tmp_path / 'whole'} does not fit "
        "this model: shapes differ",
    }
    for name, cause in causes.items():
        proc, out, err = done[name]
        lines = (out + err).splitlines()
        assert proc.returncode == (2 if name == "mismatched" else 1), (name, out + err)
        assert len(lines) == 1, (name, out + err)
        failed = "" if name == "mismatched" else " failed"  # a usage error is no crash
        assert lines[0].startswith(f"multigpu: error: rank 0 on {host}{failed}: {cause}"), lines

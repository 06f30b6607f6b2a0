"""Workers of the tests of checkpoints multigpu did not write: plain DCP directories (written
here with plain torch: FSDP2 and ``dcp.save``, laid out as torchtitan lays out its step
directories) and hub-format weights (module-level: ``run_distributed`` pickles them by name)."""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn

import multigpu

VOCAB = 40


def net() -> nn.Module:
    """A small model whose tensors FSDP shards unevenly on 2 ranks (13 rows: 7 and 6)."""
    return nn.Sequential(nn.Embedding(VOCAB, 8), nn.Linear(8, 13), nn.ReLU(), nn.Linear(13, VOCAB))


def hf_model(kind: str) -> nn.Module:
    """A small GPT-2 (tied embeddings) or Llama (untied), from configs, seeded."""
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    if kind == "gpt2":
        config: Any = transformers.GPT2Config(
            n_layer=2, n_embd=32, n_head=2, vocab_size=96, n_positions=32, bos_token_id=0,
            eos_token_id=0,
        )  # fmt: skip
        return transformers.GPT2LMHeadModel(config).eval()
    config = transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=96, max_position_embeddings=32, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval()


def holder(state: dict[str, torch.Tensor], tied: dict[str, str]) -> nn.Module:
    """A module with ``state``'s parameters under the same names (``tied``: {name: the name
    whose parameter it shares}): a transformers model's checkpoint, without transformers in the
    worker processes (importing it there costs each of them seconds)."""
    root = nn.Module()
    params: dict[str, nn.Parameter] = {}
    for name, value in state.items():
        *path, leaf = name.split(".")
        node = root
        for part in path:
            if not hasattr(node, part):
                node.add_module(part, nn.Module())
            node = getattr(node, part)
        params[name] = params[tied[name]] if name in tied else nn.Parameter(value.clone())
        node.register_parameter(leaf, params[name])
    return root


def save_sharded(root: str, models: dict[str, tuple[dict[str, Any], dict[str, str]]]) -> None:
    """Each of ``models`` ({name: (state, tied)}) saved by ``ctx.save`` under FSDP: each rank
    writes its shards, as a training run on 2 processes does."""
    with multigpu.init(strategy="fsdp", seed=0) as ctx:
        for name, (state, tied) in models.items():
            ctx.save(f"{root}/{name}", {"model": ctx.setup(holder(state, tied))})


def _torchtitan_step(directory: str) -> dict[str, torch.Tensor]:
    """What torchtitan's checkpointer writes, with plain torch: an FSDP2 model's keys at the top
    level beside a flattened optimizer, ``lr_scheduler``, ``dataloader`` and ``train_state``.
    Returns the whole model state (rank 0)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(7)
    model = net()
    fully_shard(model, mesh=init_device_mesh("cpu", (2,)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.arange(6)).sum().backward()
    optimizer.step()
    flat = StateDictOptions(flatten_optimizer_state_dict=True)
    state = {
        **get_model_state_dict(model),
        "optimizer": get_optimizer_state_dict(model, optimizer, options=flat),
        "lr_scheduler": {"last_epoch": 1},
        "dataloader": {"dp_rank_0": b"\x00", "world_size": 2},
        "train_state": {"step": 1, "ntokens_seen": 6},
    }
    dcp.save(state, checkpoint_id=directory)
    whole = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=whole)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.args: list[Any] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.args.append(record.args)


def fsdp_reads(hub_file: str, titan_dir: str, save_dir: str) -> dict[str, Any]:
    """On 2 ranks: write a torchtitan step directory; load it, and the safetensors file
    ``hub_file``, under multigpu's FSDP into a model made on the meta device; save that
    model (a manifest recording FSDP's units); load a misfit, which every rank refuses."""
    records = _Records()
    log = logging.getLogger("multigpu.checkpoint.formats.hub_load")
    log.addHandler(records)
    log.setLevel(logging.INFO)
    out: dict[str, Any] = {}
    with multigpu.init(strategy="fsdp", seed=0) as ctx:
        out["titan"] = _torchtitan_step(titan_dir)
        with ctx.init_module():
            from_titan = net()
        from_titan = ctx.setup(from_titan)
        out["titan_rest"] = ctx.load(titan_dir, {"model": from_titan})
        out["from_titan"] = ctx.full_state_dict(from_titan)
        with ctx.init_module():
            model = net()
        model = ctx.setup(model)
        out["hub_rest"] = ctx.load(hub_file, {"model": model})
        out["from_hub"] = ctx.full_state_dict(model)
        out["read"] = [(a[3], a[4]) for a in records.args]  # (MiB read, MiB in the files)
        ctx.save(save_dir, {"model": model})
        wrong = ctx.setup(nn.Sequential(nn.Embedding(VOCAB, 8), nn.Linear(8, 14)))
        try:
            ctx.load(hub_file, {"model": wrong})
            out["misfit"] = "loaded"
        except multigpu.CheckpointError as e:
            out["misfit"] = str(e)
    log.removeHandler(records)
    return out

"""The hub format's own names (``checkpoint/formats/hub_names``), and its canary: transformers 5's
conversion mapping, applied as ``from_pretrained`` applies it and reverted as ``save_pretrained``
reverts it — checked against transformers' own ``revert_weight_conversion``, so a transformers
that changes the pieces used fails here first."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import multigpu
from multigpu.checkpoint.formats.hub_names import FIX, hub_names, model_names
from multigpu.cli.ckpt import ckpt_main
from multigpu.testing import run_distributed
from tests.checkpoint import hub_names_workers as w

pytestmark = pytest.mark.requires("module:transformers")


def saved(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What ``save_pretrained`` writes for ``model`` (nothing tied), in its order."""
    from transformers.core_model_loading import revert_weight_conversion

    return revert_weight_conversion(model, model.state_dict())  # type: ignore[no-any-return]


def saved_names(model: torch.nn.Module) -> list[str]:
    """The names, in order, that ``save_pretrained`` writes for ``model``."""
    return list(saved(model))


def test_names_map_both_ways_as_transformers_maps_them(monkeypatch: pytest.MonkeyPatch) -> None:
    for build, renamed in ((w.vit_model, 32), (w.neox, 1)):
        model = build()
        own = list(model.state_dict())
        hub = saved_names(model)
        out = hub_names(model, own)
        assert [out.written.get(n, n) for n in out.order] == hub  # names and order
        assert len(out.written) == renamed and f"{renamed} names as save_pretrained" in out.note
        again = hub_names(model, hub[::-1])  # already the hub's (a hub source): read, written
        assert [again.written.get(n, n) for n in again.order] == hub and again.written == {}
        back = model_names(model, hub, set(own))
        assert back.refused == "" and sorted(back.renamed.get(n, n) for n in hub) == sorted(own)
        assert type(model).__name__ in back.via and "transformers 5." in back.via
        assert model_names(model, own, set(own)).renamed == {}  # the model's names: as they are
    other = hub_names(w.vit_model(), ["head.weight"])  # another model's checkpoint: kept
    assert other.written == {} and "head.weight is not a name of ViTModel" in other.note
    moe = w.mixtral()  # experts: one tensor in the model, one per expert in the files
    refused = model_names(moe, saved_names(moe), set(moe.state_dict())).refused
    assert "through transformers' MergeModulelist, Concatenate (MixtralForCausalLM's" in refused
    assert refused.endswith(FIX)
    with pytest.raises(multigpu.UsageError, match=r"stores model\.layers\.0\.mlp\.experts\."):
        hub_names(moe, list(moe.state_dict()))
    # A transformers without the conversion mapping (4.x: modules named as the hub): no renames.
    vit = w.vit_model()
    hub = saved_names(vit)
    monkeypatch.setitem(sys.modules, "transformers.conversion_mapping", None)
    assert model_names(vit, hub, set(vit.state_dict())).renamed == {}
    assert hub_names(vit, list(vit.state_dict())).written == {}


def test_load_weights_renames_and_a_conversion_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.manual_seed(0)
    vit = w.vit_model()
    vit.save_pretrained(tmp_path / "vit", max_shard_size="20KB")
    resharded = ["convert", str(tmp_path / "vit"), str(tmp_path / "again"), "--to", "safetensors"]
    resharded += ["--config", str(tmp_path / "vit" / "config.json"), "--max-shard-size", "20KB"]
    # Built without its pooler (add_pooling_layer=False), which the config does not record: the
    # config's ViTModel has one, which from_pretrained would leave random.
    lacks = "the checkpoint lacks 2 of its tensors, which from_pretrained would leave random: "
    with pytest.raises(multigpu.UsageError, match=lacks + r"pooler\.dense\.weight"):
        ckpt_main(resharded)
    assert not (tmp_path / "again").exists()
    type(vit)(vit.config).save_pretrained(tmp_path / "pooled", max_shard_size="20KB")
    resharded[1] = str(tmp_path / "pooled")
    resharded[-3] = str(tmp_path / "pooled" / "config.json")
    assert ckpt_main(resharded) == 0  # the hub's names in and out, in save_pretrained's order
    for file in ("model.safetensors.index.json", "config.json"):
        assert (tmp_path / "again" / file).read_text() == (tmp_path / "pooled" / file).read_text()
    fresh = w.vit_model()
    report = multigpu.load_weights(fresh, tmp_path / "vit")
    assert "renamed 32 by ViTModel's conversion mapping (transformers 5." in str(report)
    assert all(torch.equal(v, fresh.state_dict()[k]) for k, v in vit.state_dict().items())
    moe = w.mixtral()
    moe.save_pretrained(tmp_path / "moe")
    before = {k: v.clone() for k, v in moe.state_dict().items()}
    message = r"do not load into MixtralForCausalLM as stored: the files' model\.layers\.0\."
    with pytest.raises(multigpu.CheckpointMismatchError, match=message):
        multigpu.load_weights(moe, tmp_path / "moe")
    with multigpu.init(seed=0, accelerator="cpu", environ={}) as ctx:
        model = ctx.setup(moe)
        with pytest.raises(multigpu.CheckpointMismatchError, match="MergeModulelist, Concat"):
            ctx.load(tmp_path / "moe", {"model": model})
        ctx.save(tmp_path / "ck", {"model": model})
    assert all(torch.equal(v, moe.state_dict()[k]) for k, v in before.items())  # untouched
    convert = ["convert", str(tmp_path / "ck"), str(tmp_path / "out"), "--to", "safetensors"]
    config = ["--config", str(tmp_path / "moe" / "config.json")]
    with pytest.raises(multigpu.UsageError, match="drop --config to write the checkpoint's"):
        ckpt_main([*convert, *config])
    assert not (tmp_path / "out").exists()
    assert ckpt_main(convert) == 0  # without a config: the checkpoint's (the model's) names
    assert multigpu.load_weights(w.mixtral(), tmp_path / "out").renamed == 0


def test_fsdp_reads_hub_names_by_a_class_keyed_mapping_and_inside_a_users_model(
    tmp_path: Path,
) -> None:
    from safetensors.torch import save_file

    torch.manual_seed(0)
    vit, scorer = w.vit_model(), w.Scorer()
    vit.save_pretrained(tmp_path / "vit")  # the root's mapping is keyed by its class, ViTModel
    lm = saved(scorer.lm)
    assert "embed_out.weight" in lm  # the hub's name of lm_head.weight
    files = {f"lm.{k}": v for k, v in lm.items()}
    files |= {f"score.{k}": v for k, v in scorer.score.state_dict().items()}
    save_file(files, str(tmp_path / "scorer.safetensors"))
    sources = {"vit": str(tmp_path / "vit"), "scorer": str(tmp_path / "scorer.safetensors")}
    rank0, _ = run_distributed(w.load_under_fsdp, world_size=2, args=(sources,), timeout=180)
    for name, reference in (("vit", vit), ("scorer", scorer)):
        loaded = rank0[name]
        assert loaded.keys() == reference.state_dict().keys()
        for key, value in reference.state_dict().items():
            assert torch.equal(loaded[key], value), (name, key)

"""``ckpt convert --to safetensors``: a GPT-2 (tied embeddings) and a Llama, saved sharded by
FSDP on 2 processes, exported to the Hugging Face layout and loaded by ``transformers``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import multigpu
from multigpu.cli.ckpt import ckpt_main
from multigpu.testing import run_distributed
from tests.checkpoint import foreign_workers as w

pytestmark = pytest.mark.requires("module:transformers")


def _layout(directory: Path) -> tuple[list[str], dict[str, str] | None]:
    index = directory / "model.safetensors.index.json"
    weight_map = json.loads(index.read_text())["weight_map"] if index.is_file() else None
    return sorted(p.name for p in directory.glob("*.safetensors")), weight_map


def test_gpt2_and_llama_export_as_save_pretrained_and_load_with_equal_logits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoModelForCausalLM

    models = {kind: w.hf_model(kind) for kind in ("gpt2", "llama")}
    states = {
        kind: (
            model.state_dict(),
            {"lm_head.weight": "transformer.wte.weight"} if kind == "gpt2" else {},
        )
        for kind, model in models.items()
    }
    run_distributed(w.save_sharded, world_size=2, args=(str(tmp_path), states))
    tokens = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(0))
    for kind, reference in models.items():
        ref_dir, out = tmp_path / f"ref-{kind}", tmp_path / f"out-{kind}"
        reference.save_pretrained(ref_dir, max_shard_size="20KB")  # the layout to match
        argv = ["convert", str(tmp_path / kind), str(out), "--to", "safetensors"]
        argv += ["--config", str(ref_dir / "config.json"), "--max-shard-size", "20KB"]
        assert ckpt_main(argv) == 0
        said = capsys.readouterr().out
        assert f"object 'model' (sharded: 2 rank(s), fsdp) ({tmp_path / kind})" in said
        files, weight_map = _layout(out)
        assert (files, weight_map) == _layout(ref_dir) and len(files) > 1
        assert (out / "config.json").read_bytes() == (ref_dir / "config.json").read_bytes()
        assert weight_map is not None and ("lm_head.weight" in weight_map) == (kind == "llama")
        loaded = AutoModelForCausalLM.from_pretrained(out).eval()
        with torch.no_grad():
            assert torch.equal(loaded(tokens).logits, reference(tokens).logits)
    # Default shard size: one model.safetensors, no index, as save_pretrained writes it too.
    config = str(tmp_path / "ref-gpt2" / "config.json")
    one = tmp_path / "one"
    argv = ["convert", str(tmp_path / "gpt2"), str(one), "--to", "safetensors", "--config", config]
    assert ckpt_main(argv) == 0
    assert _layout(one) == (["model.safetensors"], None)
    # From a torch.save file without a config: both names written, each its own memory.
    torch.save(models["gpt2"].state_dict(), tmp_path / "gpt2.pt")
    both = tmp_path / "both"
    assert ckpt_main(["convert", str(tmp_path / "gpt2.pt"), str(both), "--to", "safetensors"]) == 0
    assert "29 tensors from plain state dict" in capsys.readouterr().out
    assert _layout(both) == (["model.safetensors"], None)
    # ... and with the config: the tied head left out, as save_pretrained leaves it out (a
    # checkpoint of multigpu's holds it once already; a plain state dict has both names).
    once = tmp_path / "once"
    argv = ["convert", str(tmp_path / "gpt2.pt"), str(once), "--to", "safetensors"]
    assert ckpt_main([*argv, "--config", config]) == 0
    tied = "tied, written once: lm_head.weight (= transformer.wte.weight)"
    assert tied in capsys.readouterr().out
    assert _layout(once) == _layout(one)
    # ... which ctx.load takes back into a GPT-2: the tied head read from the embedding.
    again = w.hf_model("gpt2")
    torch.nn.init.zeros_(again.transformer.wte.weight)
    with multigpu.init(seed=0, accelerator="cpu", environ={}) as ctx:
        again = ctx.setup(again)
        assert ctx.load(one, {"model": again}) == {}
    with torch.no_grad():
        assert torch.equal(again(tokens).logits, w.hf_model("gpt2")(tokens).logits)


def test_a_failed_export_leaves_nothing_and_an_existing_one_needs_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    llama = w.hf_model("llama")
    with multigpu.init(seed=0, accelerator="cpu", environ={}) as ctx:
        ctx.save(tmp_path / "ck", {"model": llama})
    llama.config.tie_word_embeddings = True  # a config that does not fit the trained model
    llama.config.save_pretrained(tmp_path / "tied")
    (tmp_path / "taken").write_text("a file, not a directory")
    capsys.readouterr()
    src, to = str(tmp_path / "ck"), ["--to", "safetensors"]
    cases = [
        ([src, str(tmp_path / "out"), *to, "--config", str(tmp_path / "tied" / "config.json")],
         "lm_head.weight differs from model.embed_tokens.weight in the checkpoint"),
        ([src, str(tmp_path / "taken"), *to, "--force"], "exists and is not a directory"),
        ([src, src, *to, "--force"], "is a checkpoint; --force writes a model into a model dir"),
        ([src, str(tmp_path / "out"), *to, "--max-shard-size", "5 parsecs"], "is not a size"),
        ([src, str(tmp_path / "out.pt"), "--config", "c.json"], "add --to safetensors"),
    ]  # fmt: skip
    for argv, message in cases:
        with pytest.raises(multigpu.UsageError, match=message):  # exit 2 from the CLI's main
            ckpt_main(["convert", *argv])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "taken", "tied"]
    out = tmp_path / "out"
    assert ckpt_main(["convert", src, str(out), *to]) == 0
    with pytest.raises(multigpu.UsageError, match="exists; expected a new directory; pass --for"):
        ckpt_main(["convert", src, str(out), *to])
    (out / "model.safetensors").write_bytes(b"an older export")
    assert ckpt_main(["convert", src, str(out), *to, "--force"]) == 0
    capsys.readouterr()
    assert ckpt_main(["inspect", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "safetensors weights (1 file)"
    assert sorted(r["name"] for r in info["tensors"]) == sorted(llama.state_dict())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "out", "taken", "tied"]


def test_load_weights_reads_a_tied_model_from_the_hub_format_it_holds_once(
    tmp_path: Path,
) -> None:
    source = w.hf_model("gpt2")
    source.save_pretrained(tmp_path / "hub")  # lm_head.weight left out: it is wte's
    target = w.hf_model("gpt2")
    torch.nn.init.zeros_(target.transformer.wte.weight)
    multigpu.load_weights(target, tmp_path / "hub")
    assert torch.equal(target.lm_head.weight, source.lm_head.weight)
    assert target.lm_head.weight is target.transformer.wte.weight  # still one tensor


def test_a_mismatch_never_names_the_models_tied_name_as_one_the_files_have(
    tmp_path: Path,
) -> None:
    import transformers

    w.hf_model("gpt2").save_pretrained(tmp_path / "hub")  # lm_head.weight left out: wte's
    config = w.hf_model("gpt2").config
    config.n_layer = 3
    deeper = transformers.GPT2LMHeadModel(config)
    with multigpu.init(seed=0, accelerator="cpu", environ={}) as ctx:
        deeper = ctx.setup(deeper)
        with pytest.raises(multigpu.CheckpointMismatchError) as refused:
            ctx.load(tmp_path / "hub", {"model": deeper})
    said = str(refused.value)
    assert "the files lack 12: transformer.h.2.attn.c_attn.bias," in said
    assert "lm_head" not in said  # read from transformer.wte.weight, which the files have


def test_force_writes_into_a_model_directory_and_keeps_the_files_it_did_not_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoModelForCausalLM

    llama = w.hf_model("llama")
    with multigpu.init(seed=0, accelerator="cpu", environ={}) as ctx:
        ctx.save(tmp_path / "ck", {"model": llama})
    out = tmp_path / "model"
    llama.save_pretrained(out, max_shard_size="20KB")  # shards, their index, config.json
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) > 1
    ours = {"README.md": "# my model\n", "tokenizer.json": "{}\n", "notes/todo.txt": "eval\n"}
    for name, text in ours.items():
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_text(text)
    config = (out / "config.json").read_bytes()
    src, to = str(tmp_path / "ck"), ["--to", "safetensors", "--force"]
    capsys.readouterr()
    # One file now: the earlier shards and their index go (no loader may mix the two).
    assert ckpt_main(["convert", src, str(out), *to]) == 0
    kept = "kept the 5 other files there (README.md, config.json, generation_config.json, ...)"
    assert kept in capsys.readouterr().out
    theirs = ["README.md", "config.json", "generation_config.json", "notes", "tokenizer.json"]
    assert sorted(p.name for p in out.iterdir()) == sorted([*theirs, "model.safetensors"])
    assert {n: (out / n).read_text() for n in ours} == ours
    assert (out / "config.json").read_bytes() == config  # not given: not written
    # Shards again, with the config: model.safetensors goes, the others stay.
    (out / "config.json").write_text("{}")  # replaced by --config's
    argv = [*to, "--max-shard-size", "20KB"]
    llama.config.save_pretrained(tmp_path / "cfg")
    argv += ["--config", str(tmp_path / "cfg" / "config.json")]
    assert ckpt_main(["convert", src, str(out), *argv]) == 0
    listing = [*theirs, *shards, "model.safetensors.index.json"]
    assert sorted(p.name for p in out.iterdir()) == sorted(listing)
    assert {n: (out / n).read_text() for n in ours} == ours
    tokens = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(0))
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        assert torch.equal(loaded(tokens).logits, llama(tokens).logits)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dir left
    # Something in the way of a file the export writes: refused before anything is written.
    (tmp_path / "blocked" / "model.safetensors").mkdir(parents=True)
    (tmp_path / "blocked" / "README.md").write_text("mine\n")
    with pytest.raises(multigpu.UsageError, match=r"model\.safetensors is in the way \(not a fi"):
        ckpt_main(["convert", src, str(tmp_path / "blocked"), *to])
    assert sorted(p.name for p in (tmp_path / "blocked").iterdir()) == [
        "README.md",
        "model.safetensors",
    ]

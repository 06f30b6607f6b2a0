"""``ckpt convert --to safetensors --config``: a config of another model, or of another width,
is refused in one line and nothing is written; the config of the trained model exports files that
``from_pretrained`` loads whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import multigpu
from multigpu.cli.ckpt import ckpt_main
from tests.checkpoint import foreign_workers as w
from tests.launch._util import run_multigpu

pytestmark = pytest.mark.requires("module:transformers")


def _qwen2(*, hidden: int = 32, tied: bool = True) -> Any:
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        num_hidden_layers=2, hidden_size=hidden, intermediate_size=64, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=96, max_position_embeddings=32,
        tie_word_embeddings=tied,
    )  # fmt: skip
    return transformers.Qwen2ForCausalLM(config).eval()


def _mistral() -> Any:
    import transformers

    config = transformers.MistralConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=96, max_position_embeddings=32,
    )  # fmt: skip
    return transformers.MistralForCausalLM(config)


def test_a_config_of_another_model_or_width_is_refused_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    trained = _qwen2()  # tied: the checkpoint holds the embedding, not lm_head.weight
    with multigpu.init(seed=0, accelerator="cpu", environ={}) as ctx:
        ctx.save(tmp_path / "ck", {"model": ctx.setup(trained)})
    configs = {
        "mistral": _mistral().config,  # another model: no q/k/v biases, an untied head
        "wide": _qwen2(hidden=64).config,  # another width
        "untied": _qwen2(tied=False).config,  # the same model with a head of its own
        "qwen2": trained.config,
    }
    for name, config in configs.items():
        config.save_pretrained(tmp_path / name)
    # A hub directory missing a tensor (save_pretrained's, one tensor taken out).
    trained.save_pretrained(tmp_path / "hub")
    tensors = load_file(tmp_path / "hub" / "model.safetensors")
    del tensors["model.norm.weight"]
    save_file(tensors, tmp_path / "hub" / "model.safetensors", metadata={"format": "pt"})
    before = sorted(p.name for p in tmp_path.iterdir())
    src, to = str(tmp_path / "ck"), ["--to", "safetensors"]
    cases = {
        "mistral": r"describes a MistralForCausalLM that does not fit the checkpoint's model \("
        r"multigpu checkpoint step 0.*: the checkpoint lacks 1 of its tensors, which "
        r"from_pretrained would leave random: lm_head\.weight; it has no 6 of the checkpoint's: "
        r"model\.layers\.0\.self_attn\.q_proj\.bias",
        "wide": r"describes a Qwen2ForCausalLM .*: shapes differ: model\.embed_tokens\.weight "
        r"\(96, 32\) in the checkpoint vs \(96, 64\)",
        "untied": r"lacks 1 of its tensors, which from_pretrained would leave random: "
        r"lm_head\.weight; nothing written: give the config\.json of the model that was trained",
    }
    for name, message in cases.items():
        argv = ["convert", src, str(tmp_path / "out"), *to, "--config"]
        with pytest.raises(multigpu.UsageError, match=message):
            ckpt_main([*argv, str(tmp_path / name / "config.json")])
    argv = ["convert", str(tmp_path / "hub"), str(tmp_path / "out"), *to, "--config"]
    with pytest.raises(multigpu.UsageError, match=r"lacks 1 .*: model\.norm\.weight; nothing"):
        ckpt_main([*argv, str(tmp_path / "qwen2" / "config.json")])
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing, not even a temp dir
    # From the command line: exit code 2, one line.
    done = run_multigpu(
        ["ckpt", "convert", src, "out", *to, "--config", str(tmp_path / "wide" / "config.json")],
        tmp_path,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("multigpu: error: --config "), done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    # The trained model's config: every tensor loads, the head from the embedding.
    capsys.readouterr()
    out = tmp_path / "out"
    argv = ["convert", src, str(out), *to, "--config", str(tmp_path / "qwen2" / "config.json")]
    assert ckpt_main(argv) == 0
    assert "tied, written once" not in capsys.readouterr().out  # held once in the checkpoint
    loaded, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    tokens = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded.eval()(tokens).logits, trained(tokens).logits)


def test_names_transformers_ignores_on_load_pass(tmp_path: Path) -> None:
    """GPT-2 files of transformers 4 hold each block's causal mask buffer (``attn.bias``), which
    transformers 5's GPT-2 has not and ignores on load: no reason to refuse them."""
    gpt2 = w.hf_model("gpt2")
    gpt2.config.save_pretrained(tmp_path / "cfg")
    state = dict(gpt2.state_dict())
    state["transformer.h.0.attn.bias"] = torch.tril(torch.ones(1, 1, 32, 32, dtype=torch.bool))
    torch.save(state, tmp_path / "old.pt")
    argv = ["convert", str(tmp_path / "old.pt"), str(tmp_path / "out"), "--to", "safetensors"]
    assert ckpt_main([*argv, "--config", str(tmp_path / "cfg" / "config.json")]) == 0
    state.pop("transformer.h.0.attn.bias")
    state["transformer.h.0.attn.extra"] = torch.zeros(1)  # not ignored: refused
    torch.save(state, tmp_path / "new.pt")
    argv[1], argv[2] = str(tmp_path / "new.pt"), str(tmp_path / "out2")
    with pytest.raises(multigpu.UsageError, match=r"has no 1 of the checkpoint's: transformer\.h"):
        ckpt_main([*argv, "--config", str(tmp_path / "cfg" / "config.json")])

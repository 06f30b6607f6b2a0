"""Which units FSDP shards a model into, without processes: blocks wherever they sit, tied weights.

Plain torch models here; the Hugging Face models (small configs, built in a second each) in
``test_fsdp_unit_models.py``. What the units do when sharded, on real processes:
``test_fsdp_tied_processes.py``.
"""

from __future__ import annotations

from torch import nn

from multigpu.examples import lm
from multigpu.examples.digits import DigitsCNN
from multigpu.strategies.fsdp_ties import resolve_ties
from multigpu.strategies.fsdp_units import choose_blocks, plan_units
from tests.strategies.fsdp_tied_workers import SharingNet, TiedLM


class ToyBlock(nn.Module):
    """pytorch/examples' FSDP2 transformer block, in shape: norms, attention, feed-forward."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(dim)
        self.attention = nn.MultiheadAttention(dim, 4, batch_first=True)
        self.ffn_norm = nn.LayerNorm(dim)
        self.feed_forward = nn.Sequential(
            nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)
        )


class ToyTransformer(nn.Module):
    """pytorch/examples' FSDP2 model at its size there (dim 16: ~3k parameters a block)."""

    def __init__(self, n_layers: int = 3, dim: int = 16, vocab: int = 1024) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(ToyBlock(dim) for _ in range(n_layers))
        self.norm = nn.LayerNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)


def test_a_tied_embedding_and_head_are_one_unit_never_two() -> None:
    net = TiedLM()  # both 128k: large enough to be units of their own, but one weight
    plan = plan_units(net)
    assert plan.names == ["emb+head", "<root>"] and str(plan.choice).startswith("children of")
    tied, _root = plan.units
    assert tied.tied and tied.modules == (net.emb, net.head)
    assert plan.sizes == [("emb+head", 128_000), ("", 128 * 128 + 128)]
    # torch 2.4's fully_shard takes one module: then both stay with the root
    assert [u.name for u in resolve_ties(net, choose_blocks(net).blocks, groups=False)] == [""]
    # one of them a unit and the other with the root: the unit goes back to the root
    assert plan_units(net, blocks=(nn.Embedding,)).names == ["<root>"]
    assert plan_units(net, blocks=(nn.Linear,)).names == ["body", "<root>"]


def test_a_module_shared_by_the_blocks_is_a_unit_inside_them() -> None:
    net = SharingNet()
    plan = plan_units(net)
    assert plan.names == ["blocks.0.shared", "blocks.0", "blocks.1", "<root>"]
    shared, first, *_ = plan.units
    assert shared.tied and shared.modules == (net.blocks[0].shared,)
    assert not first.tied and first.modules == (net.blocks[0],)
    assert dict(plan.sizes)["blocks.0"] == dict(plan.sizes)["blocks.1"] == 16 * 16 + 16


def test_blocks_are_units_at_any_size_and_plain_layers_from_min_block_params() -> None:
    toy = ToyTransformer()  # blocks of ~3k parameters: units all the same, as in its example
    plan = plan_units(toy)
    assert plan.names == ["layers.0", "layers.1", "layers.2", "<root>"]
    assert str(plan.choice) == "repeated: ToyBlock" and plan.warning is None
    mlp = nn.Sequential(*(nn.Linear(8, 8) for _ in range(24)))  # a test's MLP: one unit
    assert plan_units(mlp).names == ["<root>"]
    assert len(plan_units(mlp, min_block_params=72).units) == 25
    wide = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    assert plan_units(wide).names == ["0", "<root>"]  # 262k and 5k: only the first


def test_the_outermost_repeated_blocks_win_over_what_repeats_inside_them() -> None:
    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(8)
            self.experts = nn.ModuleList(nn.Sequential(nn.Linear(8, 8)) for _ in range(4))

    net = nn.Sequential(nn.Embedding(10, 8), nn.Sequential(Layer(), Layer()), nn.Linear(8, 10))
    assert plan_units(net).names == ["1.0", "1.1", "<root>"]


def test_a_model_without_blocks_has_its_large_children_looked_through_containers() -> None:
    net = nn.Sequential(
        nn.Embedding(1000, 128),  # 128k: a unit
        nn.ModuleList([nn.Linear(256, 512), nn.LayerNorm(8)]),  # looked through: 131k, 16
        nn.Conv1d(128, 10, 1),  # 1.3k: stays in the root
    )
    plan = plan_units(net)
    assert plan.names == ["0", "1.0", "<root>"]
    assert str(plan.choice) == "children of 100,000+ parameters"


def test_given_blocks_take_a_module_reached_twice_once() -> None:
    shared = nn.Linear(300, 300)
    net = nn.Sequential(shared, nn.ReLU(), shared)
    plan = plan_units(net, blocks=(nn.Linear,))
    assert plan.names == ["0", "<root>"] and str(plan.choice) == "given: Linear"


def test_our_built_in_models_shard_per_block() -> None:
    assert plan_units(lm.build_model(n_layer=2)).names == ["blocks.0", "blocks.1", "<root>"]
    digits = plan_units(DigitsCNN())  # 38k parameters, nothing to gather apart
    assert digits.names == ["<root>"] and digits.warning is None


def test_a_unit_holding_most_of_the_model_is_warned_with_the_blocks_that_split_it() -> None:
    class Net(nn.Module):  # blocks, but not in a container: nothing repeats
        def __init__(self) -> None:
            super().__init__()
            self.one, self.two = ToyBlock(128), ToyBlock(128)
            self.head = nn.Linear(128, 10)

    plan = plan_units(Net(), min_block_params=300_000)  # each block 198k: none large enough
    assert plan.names == ["<root>"]
    assert plan.warning == (
        "FSDP unit <root> holds 100% of the model's 397,834 parameters: it is gathered whole, "
        "so sharding saves little; name blocks to shard one at a time: "
        "FSDPStrategy(blocks=(ToyBlock,)) (multigpu estimate --blocks ToyBlock)"
    )
    fixed = plan_units(Net(), blocks=(ToyBlock,), min_block_params=300_000)
    assert fixed.names == ["one", "two", "<root>"] and fixed.warning is None
    tied = plan_units(TiedLM())  # 89 % in the tied pair: said so, no blocks to name
    assert tied.warning is not None and "share parameters (tied weights)" in tied.warning

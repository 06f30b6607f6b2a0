"""A user's script for ``multigpu verify``: a small Hugging Face model of one family, trained with
AdamW on random tokens, dropout off (configs built in code, nothing downloaded).

``--family opt|distilbert|bart|marian``: ``OPTForCausalLM`` (transformers shifts its labels by
one token), ``DistilBertForSequenceClassification``, ``BartForConditionalGeneration``,
``MarianMTModel``. Their attention key biases get a gradient that is zero but for rounding.
``--sgd`` trains with SGD and momentum instead (every tensor then judged by its largest
element). ``--per-rank-data`` makes the dataset depend on the world size (the user's mistake
``verify`` must still catch): each run trains on ``64 * world_size`` samples.
"""

import argparse

import torch
from torch.utils.data import TensorDataset

import multigpu

VOCAB = 128
LENGTH = 12

parser = argparse.ArgumentParser()
parser.add_argument("--family", choices=["opt", "distilbert", "bart", "marian"], required=True)
parser.add_argument("--sgd", action="store_true")
parser.add_argument("--per-rank-data", action="store_true")
args = parser.parse_args()


def build(family: str) -> torch.nn.Module:
    import transformers as hf

    small = {"vocab_size": VOCAB, "dropout": 0.0, "attention_dropout": 0.0}
    seq2seq = {
        **small,
        "d_model": 32,
        "encoder_layers": 1,
        "decoder_layers": 1,
        "encoder_attention_heads": 4,
        "decoder_attention_heads": 4,
        "encoder_ffn_dim": 64,
        "decoder_ffn_dim": 64,
        "max_position_embeddings": 32,
        "activation_dropout": 0.0,
        "pad_token_id": 1,
        "decoder_start_token_id": 2,
    }
    if family == "opt":
        config = hf.OPTConfig(
            **small,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            ffn_dim=64,
            max_position_embeddings=32,
            word_embed_proj_dim=32,
        )
        return hf.OPTForCausalLM(config)
    if family == "distilbert":
        config = hf.DistilBertConfig(
            vocab_size=VOCAB,
            dim=32,
            n_layers=2,
            n_heads=4,
            hidden_dim=64,
            max_position_embeddings=32,
            dropout=0.0,
            attention_dropout=0.0,
            seq_classif_dropout=0.0,
            num_labels=3,
        )
        return hf.DistilBertForSequenceClassification(config)
    if family == "bart":
        return hf.BartForConditionalGeneration(hf.BartConfig(**seq2seq))
    return hf.MarianMTModel(hf.MarianConfig(**seq2seq))


with multigpu.init(seed=0) as ctx:
    g = torch.Generator().manual_seed(0)  # the same data in every process
    samples = 64 * ctx.world_size if args.per_rank_data else 64
    tokens = torch.randint(3, VOCAB, (samples, LENGTH), generator=g)
    classes = torch.randint(0, 3, (samples,), generator=g)
    model = build(args.family)
    if args.sgd:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = ctx.setup(model, optimizer)
    loader = ctx.loader(TensorDataset(tokens, classes), batch_size=16)
    for _epoch in range(10):
        for x, y in loader:
            if args.family == "distilbert":
                loss = model(input_ids=x, labels=y).loss
            elif args.family == "opt":
                loss = model(input_ids=x, labels=x).loss
            else:  # translate the sequence into itself reversed
                loss = model(input_ids=x, labels=x.flip(1)).loss
            optimizer.zero_grad()
            ctx.backward(loss)
            optimizer.step()

"""multigpu's own checkpoint format: how it is written, verified, chosen and restored.

A checkpoint is a directory (``layout``: manifest, ``COMMITTED``, ``state.pt``, rank files and
the models' and optimizers' shards on ``torch.distributed.checkpoint``: ``sharded``, their state
from the strategy: ``snapshot``; the other objects: ``objects``; RNGs: ``rng``). ``saving`` is
one save on every rank (``writer``: its files, ``space``: the disk it needs); ``restore`` puts a
checkpoint back; ``manager`` is the ``Checkpointer`` (``lock``: one run per directory,
``progress``: whether anything moved since the last save). Reading it as one format among
others (inspect, load_weights, convert, ``ctx.load``) is ``formats.native_format``'s.
"""

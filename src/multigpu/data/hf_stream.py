"""Hugging Face ``datasets.IterableDataset`` as a stream for ``StreamLoader`` (no import of it).

Recognised by its class (``datasets.IterableDataset``, a subclass of torch's ``IterableDataset``
only where torch was installed when ``datasets`` was imported), so that neither ``import
multigpu`` nor a plain stream imports ``datasets``.

Its own shuffle (``stream.shuffle(seed=..., buffer_size=...)``) is deterministic given its seed
and the epoch that ``set_epoch`` tells it; one made without a seed draws a different order in
every process (NumPy's ``default_rng(None)``), so the ranks would disagree on the global order:
``unseeded_shuffle`` finds it (its generator's ``SeedSequence`` entropy is the seed given, or a
128-bit draw from the OS when none was), and the loader refuses it.
"""

from __future__ import annotations

from typing import Any

_OS_DRAWN = 1 << 64  # a seed given by hand is below this; NumPy's own draw is 128 bits


def is_hf_stream(obj: Any) -> bool:
    """Whether ``obj`` is a Hugging Face ``datasets.IterableDataset`` (or a subclass).

    Example:
        >>> is_hf_stream(range(3))
        False
    """
    return any(
        cls.__name__ == "IterableDataset" and cls.__module__.split(".")[0] == "datasets"
        for cls in type(obj).__mro__
    )


def unseeded_shuffle(stream: Any) -> bool:
    """Whether an HF stream shuffles with a generator made without a seed (best effort: the
    chain of its example iterables, ``_ex_iterable`` and each one's ``ex_iterable(s)``; False
    where that chain is not as ``datasets`` 3-5 make it)."""
    seen: set[int] = set()
    todo = [getattr(stream, "_ex_iterable", None)]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        generator = getattr(node, "generator", None)
        seed_seq = getattr(getattr(generator, "bit_generator", None), "seed_seq", None)
        entropy = getattr(seed_seq, "entropy", 0)
        if entropy is None or (isinstance(entropy, int) and entropy >= _OS_DRAWN):
            return True
        todo.append(getattr(node, "ex_iterable", None))
        todo.extend(getattr(node, "ex_iterables", None) or ())
    return False


def split_by_node(stream: Any) -> bool:
    """Whether an HF stream was split by ``datasets.distributed.split_dataset_by_node`` (its
    ``_distributed`` config): each rank would then read another stream."""
    return getattr(stream, "_distributed", None) is not None


def prepare_worker(stream: Any) -> None:
    """In a DataLoader worker, before reading an HF stream: what ``datasets`` does itself in a
    worker (a path the loader bypasses) — fsspec's async lock made anew, since a forked worker
    inherits the parent's, which a remote file system's reads could then wait on forever."""
    if not is_hf_stream(stream):
        return
    try:
        import fsspec.asyn
    except ImportError:  # no fsspec: no such lock
        return
    fsspec.asyn.reset_lock()


def describe(stream: Any) -> str:
    """A short name of ``stream`` for a line: ``datasets.IterableDataset`` or its class name."""
    kind = type(stream).__name__
    return f"datasets.{kind}" if is_hf_stream(stream) else kind

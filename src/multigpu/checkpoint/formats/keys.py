"""State-dict keys of wrapped models: strip ``module.`` / ``_orig_mod.`` without renaming blindly.

DataParallel and DDP save their model's keys under ``module.``, ``torch.compile`` under
``_orig_mod.``, and wrappers stack (``module._orig_mod.``). A model may also own a submodule
really named ``module``, so a prefix is removed only where that makes the keys match the model
(or, with no model to compare, only while every key has it). Renaming is torch's own
``consume_prefix_in_state_dict_if_present``, which also renames the ``_metadata`` (per-module
versions) that ``load_state_dict`` reads.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

PREFIXES = ("module.", "_orig_mod.")
"""Key prefixes added by DataParallel/DDP and by torch.compile."""
_MAX_DEPTH = 4  # wrappers stacked deeper than DDP(compile(DDP(...))) do not occur


def _copy(state: Mapping[str, Any]) -> OrderedDict[str, Any]:
    out: OrderedDict[str, Any] = OrderedDict(state)
    metadata = getattr(state, "_metadata", None)
    if metadata is not None:
        out._metadata = OrderedDict(metadata)  # type: ignore[attr-defined]
    return out


def strip_prefix(state: Mapping[str, Any], prefix: str) -> OrderedDict[str, Any] | None:
    """A copy of ``state`` with ``prefix`` removed from every key that has it, or None when two
    keys would collide."""
    out = _copy(state)
    consume_prefix_in_state_dict_if_present(out, prefix)
    return out if len(out) == len(state) else None


def strip_common_prefixes(
    state: Mapping[str, Any],
) -> tuple[OrderedDict[str, Any], tuple[str, ...]]:
    """Strip ``module.`` / ``_orig_mod.`` while EVERY key starts with the same one.

    Example:
        >>> state, stripped = strip_common_prefixes({"module._orig_mod.w": 1})
        >>> dict(state), stripped
        ({'w': 1}, ('module.', '_orig_mod.'))
    """
    out, stripped = _copy(state), []
    while out:
        prefix = next((p for p in PREFIXES if all(k.startswith(p) for k in out)), None)
        if prefix is None:
            break
        out = strip_prefix(out, prefix) or out  # all keys share it: they cannot collide
        stripped.append(prefix)
    return out, tuple(stripped)


def _strippings(
    state: Mapping[str, Any], done: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], OrderedDict[str, Any]]]:
    if len(done) >= _MAX_DEPTH:
        return
    for prefix in PREFIXES:
        if any(k.startswith(prefix) for k in state):
            candidate = strip_prefix(state, prefix)
            if candidate is not None:
                yield (*done, prefix), candidate
                yield from _strippings(candidate, (*done, prefix))


def match_keys(
    state: Mapping[str, Any], wanted: set[str]
) -> tuple[Mapping[str, Any], tuple[str, ...]]:
    """``state`` with the wrapper prefixes that make its keys match ``wanted`` best removed.

    The stripping kept is the one matching most of ``wanted`` (the shortest of equals), and
    only if it matches more than the keys as saved; otherwise ``state`` is returned unchanged.

    Example:
        >>> state, stripped = match_keys({"module.module.w": 1}, {"module.w"})
        >>> dict(state), stripped
        ({'module.w': 1}, ('module.',))
    """
    best: tuple[tuple[str, ...], Mapping[str, Any]] = ((), state)
    best_hits = len(wanted.intersection(state))
    if best_hits == len(wanted) == len(state):
        return state, ()
    for stripped, candidate in _strippings(state):
        hits = len(wanted.intersection(candidate))
        if hits > best_hits or (hits == best_hits and best[0] and len(stripped) < len(best[0])):
            best, best_hits = (stripped, candidate), hits
    return best[1], best[0]

"""The hub format's own weight names: ``transformers``' conversion mapping, both ways.

``transformers`` 5 renamed the modules of some architectures but keeps the hub files in their
original names: ViT's module ``vit.layers.0.attention.k_proj`` is ``vit.encoder.layer.0.attention.
attention.key`` in every ``save_pretrained`` directory, on the hub, in vLLM and transformers 4.
A model's conversion mapping (``transformers.conversion_mapping.get_model_conversion_mapping``: a
list of ``WeightRenaming`` regex renames and ``WeightConverter`` conversions that concatenate,
merge or permute tensors) is applied by ``from_pretrained`` and reverted by ``save_pretrained``.

Here, with transformers' own pieces (``transformers.core_model_loading``): ``model_names`` maps
the files' names to a model's, for ``ctx.load`` and ``load_weights``; ``hub_names`` maps a
model's names to the files', for ``ckpt convert --to safetensors --config``. Renames are applied
exactly as transformers applies them (in its order, keys sorted its way); a conversion is
refused where a name depends on it, since each rank reads only its slices of the files' tensors
as they are stored. This is the only module that touches that machinery, a moving, semi-private
API: imported lazily, and a transformers without it (4.x, whose modules have the hub's names)
means no renames. ``tests/checkpoint/test_hub_names.py`` is its canary.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

from torch import nn

from multigpu.errors import CheckpointMismatchError, UsageError
from multigpu.runtime.wrappers import unwrap_module
from multigpu.torch_compat import fsdp_module_class

_HIDDEN = ("_orig_mod", "_checkpoint_wrapped_module")
"""Module-path parts that wrappers add and ``get_model_state_dict``'s names leave out
(``torch.compile``, activation checkpointing)."""

FIX = "load with transformers' from_pretrained, then ctx.setup the loaded model"
"""What to do when a name depends on a conversion (the files are read as stored)."""


def _machinery() -> Any:
    """transformers' conversion pieces, or None: no transformers imported, or one without them
    (4.x: its modules have the hub's names, there is nothing to rename)."""
    if "transformers" not in sys.modules:  # a model holding a PreTrainedModel imported it
        return None
    try:
        mapping = importlib.import_module("transformers.conversion_mapping")
        loading = importlib.import_module("transformers.core_model_loading")
        modeling = importlib.import_module("transformers.modeling_utils")
        return SimpleNamespace(
            version=sys.modules["transformers"].__version__,
            get_model_conversion_mapping=mapping.get_model_conversion_mapping,
            PreTrainedModel=modeling.PreTrainedModel,
            WeightRenaming=loading.WeightRenaming,
            WeightConverter=loading.WeightConverter,
            PrefixChange=loading.PrefixChange,
            apply_renamings=_apply_renamings,
            apply_converters=_apply_converters,
            dot_natural_key=loading.dot_natural_key,
        )
    except (ImportError, AttributeError):
        return None


# transformers 5.24's apply_renamings / apply_converters, which 5.17 lacks (it loops inline):
# both are loops over the transforms' rename_source_key, the same method in every 5.x.
def _apply_renamings(key: str, renamings: Iterable[Any]) -> str:
    """``key`` renamed by every rename in turn."""
    for renaming in renamings:
        key, _ = renaming.rename_source_key(key)
    return key


def _apply_converters(key: str, converters: Iterable[Any]) -> tuple[str, str | None]:
    """``key`` renamed by the first conversion that matches it, and that one's source pattern."""
    for converter in converters:
        renamed, pattern = converter.rename_source_key(key)
        if pattern is not None:
            return renamed, pattern
    return key, None


@contextlib.contextmanager
def _own_classes(model: nn.Module) -> Iterator[None]:
    """``fully_shard`` gives each module it wraps a class of its own (``FSDP<name>``, a subclass
    of ``FSDPModule`` and of the module's class), and transformers looks a mapping up by class
    name first (GPT-NeoX's ``GPTNeoXForCausalLM``): while it does, the modules wear their own
    classes again (nothing runs meanwhile; FSDP's are put back after)."""
    fsdp = fsdp_module_class()
    swapped = []
    for module in model.modules():
        cls = type(module)
        if isinstance(module, fsdp):
            own = next(c for c in cls.__mro__ if not issubclass(c, fsdp))
            module.__class__ = cast("type[nn.Module]", own)
            swapped.append((module, cls))
    try:
        yield
    finally:
        for module, cls in swapped:
            module.__class__ = cls


def _state_prefix(path: str) -> str:
    """A module path as its tensors' names begin (wrappers' parts left out), with a dot."""
    kept = [part for part in path.split(".") if part and part not in _HIDDEN]
    return "".join(f"{part}." for part in kept)


def _hf_models(tf: Any, module: nn.Module) -> list[tuple[str, nn.Module]]:
    """(names' prefix, model) of each outermost ``PreTrainedModel`` in ``module``'s tree; the
    sub-models inside one are scoped by transformers itself."""
    found: list[tuple[str, nn.Module]] = []
    paths: list[str] = []
    for path, sub in unwrap_module(module).named_modules():
        if isinstance(sub, tf.PreTrainedModel) and not any(
            p == "" or path.startswith(p + ".") for p in paths
        ):
            paths.append(path)
            found.append((_state_prefix(path), sub))
    return found


def _transforms(tf: Any, model: nn.Module, **kwargs: Any) -> list[Any]:
    with _own_classes(model):
        return list(tf.get_model_conversion_mapping(model, **kwargs))


def _ops(converter: Any) -> str:
    return ", ".join(type(op).__name__ for op in getattr(converter, "operations", [])) or "?"


@dataclass(frozen=True)
class FileNames:
    """How the files' names map to a model's (``model_names``)."""

    renamed: dict[str, str] = field(default_factory=dict)
    """{name in the files: name in the model} for the names that differ."""
    refused: str = ""
    """Why the files cannot be read into the model as stored (one line), or empty."""
    via: str = ""
    """Whose mapping renamed them, for a message: ``ViTForImageClassification's conversion
    mapping (transformers 5.2.0)``; empty when nothing was renamed."""


def model_names(module: nn.Module, files: Iterable[str], wanted: Collection[str]) -> FileNames:
    """The model's names for the files' ``files``, by the conversion mapping of each Hugging
    Face model in ``module``'s tree (its names scoped by that model's prefix). ``wanted``: the
    names the model has. Never raises: what cannot be loaded is said in ``refused``.

    As ``from_pretrained`` does: the renames apply to every name in turn (sorted transformers'
    way: a rename may depend on the names before it), and a renamed name the model lacks keeps
    its own name when the model has that; files already in the model's names are read as they
    are, without looking at transformers at all.
    """
    names = list(files)
    if all(n in wanted for n in names):
        return FileNames()
    tf = _machinery()
    if tf is None:
        return FileNames()
    renamed: dict[str, str] = {}
    vias: list[str] = []
    try:
        for prefix, hf in _hf_models(tf, module):
            transforms = _transforms(tf, hf)
            renamings = [t for t in transforms if isinstance(t, tf.WeightRenaming)]
            converters = [t for t in transforms if isinstance(t, tf.WeightConverter)]
            inner = [n[len(prefix) :] for n in names if n.startswith(prefix)]
            count = len(renamed)
            for key in sorted(inner, key=tf.dot_natural_key):
                new = tf.apply_renamings(key, renamings)
                new, pattern = tf.apply_converters(new, converters)
                source, target = prefix + key, prefix + new
                if target not in wanted and source in wanted:
                    continue  # transformers keeps a name the model has as it is
                if pattern is not None:
                    converter = next(c for c in converters if pattern in c.source_patterns)
                    return FileNames(
                        refused=f"the files' {source} becomes {target} through transformers' "
                        f"{_ops(converter)} ({type(hf).__name__}'s conversion mapping), a "
                        "conversion of the stored tensors, not a rename; multigpu reads each "
                        f"rank's slices of them as stored: {FIX}"
                    )
                if target != source:
                    renamed[source] = target
            if len(renamed) > count:
                vias.append(f"{type(hf).__name__}'s conversion mapping")
    except Exception as e:  # a transformers whose machinery changed: say so, on every rank
        return FileNames(
            refused=f"transformers {tf.version}'s conversion mapping could not be read "
            f"({type(e).__name__}: {' '.join(str(e).split())[:160]}); {FIX}"
        )
    targets: dict[str, str] = {}
    for name in names:
        target = renamed.get(name, name)
        if target in targets:
            return FileNames(
                refused=f"the files' {targets[target]} and {name} both name the model's "
                f"{target} after renaming; keep one of them in the files, or {FIX}"
            )
        targets[target] = name
    via = " and ".join(vias)
    return FileNames(renamed, "", f"{via} (transformers {tf.version})" if renamed else "")


def renamed_state(
    module: nn.Module, state: Mapping[str, Any], wanted: Collection[str], where: Any
) -> tuple[dict[str, Any], FileNames]:
    """``state`` (read whole from the hub-format files ``where``) under ``module``'s names
    (``model_names``), and how; a CheckpointMismatchError when a name needs a conversion."""
    names = model_names(module, state, wanted)
    if names.refused:
        raise CheckpointMismatchError(
            f"the weights in {where} do not load into {type(module).__name__} as stored: "
            f"{names.refused}"
        )
    return {names.renamed.get(k, k): v for k, v in state.items()}, names


@dataclass(frozen=True)
class HubNames:
    """A model's names as ``save_pretrained`` writes them (``hub_names``)."""

    order: list[str]
    """The model's names in the order ``save_pretrained`` writes them."""
    written: dict[str, str]
    """{name in the model: name in the files} for the names that differ."""
    note: str = ""
    """What was (not) renamed and why, for a report line; empty when there is nothing to say."""


def hub_names(model: nn.Module, names: list[str]) -> HubNames:
    """The names ``save_pretrained`` of ``model`` (a ``PreTrainedModel``, e.g. built from a
    config on the meta device) writes for the tensors ``names`` (tied copies left out).

    As ``save_pretrained`` does (``revert_weight_conversion``): the mapping of a model not
    loaded with ``from_pretrained``, without its legacy renames and ``PrefixChange``s, reversed;
    with one, the tensors are written in transformers' sorted order. ``names`` in another form
    (the hub's own, transformers 4's) are first read as ``from_pretrained`` reads them
    (``model_names``); names that are not ``model``'s either way (another model's checkpoint)
    are written as they are. A name that only a conversion makes is refused (a UsageError): an
    export streams tensors as stored.
    """
    tf = _machinery()
    if tf is None or not isinstance(model, tf.PreTrainedModel):
        return HubNames(list(names), {})
    transforms = [
        t
        for t in _transforms(tf, model, add_legacy=False)
        if not isinstance(t, tf.PrefixChange)  # save_pretrained drops them for a fresh model
    ]
    if not transforms:
        return HubNames(list(names), {})
    cls = type(model).__name__
    own = set(model.state_dict())
    incoming = model_names(model, names, own)
    as_model = {n: incoming.renamed.get(n, n) for n in names}
    foreign = [n for n in names if as_model[n] not in own]
    if incoming.refused or foreign:
        return HubNames(
            list(names),
            {},
            f"names kept: {(foreign or names)[0]} is not a name of {cls} (--config), nor one "
            "its conversion mapping renames to one of them",
        )
    reverse = [t.reverse_transform() for t in transforms[::-1]]
    renamings = [t for t in reverse if isinstance(t, tf.WeightRenaming)]
    converters = [t for t in reverse if isinstance(t, tf.WeightConverter)]
    order = sorted(names, key=lambda n: tf.dot_natural_key(as_model[n]))
    written: dict[str, str] = {}
    for name in order:
        converted, pattern = tf.apply_converters(as_model[name], converters)
        if pattern is not None:
            converter = next(c for c in converters if pattern in c.source_patterns)
            raise UsageError(
                f"--config's {cls} stores {as_model[name]} in the hub format as {converted} "
                f"through transformers' {_ops(converter)}, a conversion of the tensor, not a "
                "rename, which an export (one stored tensor at a time) does not make: drop "
                "--config to write the checkpoint's names, or load the checkpoint into the "
                "model and call save_pretrained"
            )
        new = tf.apply_renamings(as_model[name], renamings)
        if new != name:
            written[name] = new
    by_file: dict[str, str] = {}
    for name in order:
        file_name = written.get(name, name)
        if file_name in by_file:
            raise UsageError(
                f"--config's {cls} writes both {by_file[file_name]} and {name} as {file_name}; "
                "drop --config to write the checkpoint's names"
            )
        by_file[file_name] = name
    note = (
        f"{len(written)} names as save_pretrained writes them ({cls}'s conversion mapping, "
        f"transformers {tf.version})"
        if written
        else ""
    )
    return HubNames(order, written, note)

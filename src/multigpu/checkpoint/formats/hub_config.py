"""The model a ``config.json`` describes, for ``ckpt convert --to safetensors --config``.

``config_model`` builds it on the meta device (no memory) with ``transformers``: its architecture
(``architectures[0]``), else the causal LM of its ``model_type``. ``check_fits`` compares the
checkpoint's tensors with that model's state dict — names (read as ``from_pretrained`` reads
them: ``hub_names.model_names``), shapes, tied weights (either name of a tie may stand for both)
and the names ``transformers`` itself ignores on load (``_keys_to_ignore_on_load_missing`` /
``_unexpected``) — and refuses, in one line, a config of another model or of another width:
``from_pretrained`` would otherwise load the export with the tensors it lacks or cannot take
left random (a Qwen2 checkpoint under a Mistral config: no biases in the model, the head of a
tied checkpoint MISSING). ``transformers`` is imported here only to build that model, and only
then.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from multigpu.checkpoint.formats.hub_names import model_names
from multigpu.checkpoint.native.sharded import first_line
from multigpu.errors import CheckpointMismatchError, UsageError
from multigpu.runtime.wrappers import tied_names

NOT_CHECKED = "not checked against --config, tied weights and hub names not looked for"
"""The start of the note of an export whose config built no model."""


def read_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON object of a ``config.json`` (a UsageError when it is not one)."""
    p = Path(path)
    try:
        config = json.loads(p.read_text())
    except FileNotFoundError:
        raise UsageError(f"--config {p} does not exist; expected the model's config.json") from None
    except IsADirectoryError:
        raise UsageError(
            f"--config {p} is a directory; expected its config.json ({p / 'config.json'})"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"--config {p} is not readable JSON ({e}); expected a config.json") from e
    if not isinstance(config, dict):
        raise UsageError(f"--config {p} holds a JSON {type(config).__name__}, not an object")
    return config


def config_model(config: Mapping[str, Any] | None) -> tuple[Any, str]:
    """The model ``config`` describes, built on the meta device (None without a config, or when
    transformers cannot build it), and a phrase saying why not (empty when there is nothing to
    say)."""
    if config is None:
        return None, ""
    try:
        import transformers
    except ImportError:
        return None, f"{NOT_CHECKED}: transformers is not installed"
    if "model_type" not in config:
        return None, f"{NOT_CHECKED}: the config has no model_type"
    architectures = config.get("architectures") or []
    cls = getattr(transformers, str(architectures[0]), None) if architectures else None
    try:
        built = transformers.AutoConfig.for_model(**config)
        with torch.device("meta"):  # no memory: only names, shapes and which parameters are one
            # No architecture named: the causal LM of its model type, as exported models mostly are.
            model = cls(built) if cls else transformers.AutoModelForCausalLM.from_config(built)
    except Exception as e:  # a config this transformers cannot build: say so, write every tensor
        return None, f"{NOT_CHECKED}: no model built from the config ({first_line(e)})"
    return model, ""


def _few(names: list[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (f" (and {len(names) - n} more)" if len(names) > n else "")


def _ignored(model: nn.Module, which: str, name: str) -> bool:
    """Whether transformers ignores ``name`` when it is ``which`` ("missing"/"unexpected") on
    load (the model class's ``_keys_to_ignore_on_load_<which>`` regexes, searched as it does)."""
    patterns = getattr(model, f"_keys_to_ignore_on_load_{which}", None) or []
    return any(re.search(p, name) for p in patterns)


def check_fits(
    model: nn.Module,
    shapes: Mapping[str, tuple[tuple[int, ...], Any]],
    *,
    config: str | os.PathLike[str],
    source: str,
) -> str:
    """Refuse (a CheckpointMismatchError, one line) a checkpoint whose tensors ``shapes``
    ({name: (shape, dtype)}) are not those of ``model`` (the config's, ``config_model``): names
    it lacks or does not have, shapes that differ. Returns a note when the names could not be
    compared (they need one of transformers' conversions), else an empty string."""
    wanted = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    tied = tied_names(model)
    aliases = {**{k: n for n, k in tied.items()}, **tied}  # either name of a tie, both ways
    names = model_names(model, shapes, set(wanted))
    if names.refused:
        return f"names and shapes not checked against --config: {names.refused}"
    held = {names.renamed.get(n, n): n for n in shapes}
    lacks = [
        n
        for n in wanted
        if n not in held and aliases.get(n) not in held and not _ignored(model, "missing", n)
    ]
    extra = [n for n in held if n not in wanted and not _ignored(model, "unexpected", n)]
    differ = [
        f"{n} {shapes[held[n]][0]} in the checkpoint vs {wanted[n]}"
        for n in held
        if n in wanted and tuple(shapes[held[n]][0]) != wanted[n]
    ]
    problems = []
    if differ:
        problems.append(f"shapes differ: {_few(differ, 2)}")
    if lacks:
        problems.append(
            f"the checkpoint lacks {len(lacks)} of its tensors, which from_pretrained would leave "
            f"random: {_few(lacks)}"
        )
    if extra:
        problems.append(f"it has no {len(extra)} of the checkpoint's: {_few(extra)}")
    if problems:
        raise CheckpointMismatchError(
            f"--config {config} describes a {type(model).__name__} that does not fit the "
            f"checkpoint's model ({source}): {'; '.join(problems)}; nothing written: give the "
            "config.json of the model that was trained, or drop --config to write the "
            "checkpoint's names as they are (and no config.json)"
        )
    return ""

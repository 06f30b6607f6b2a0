"""Tensors that several pipeline stages use: one logical tensor, equal on every stage holding it.

``torch.distributed.pipelining`` cuts the traced model into one module per stage. A parameter
that two stages use (an embedding tied to the output head, a block run twice) is *copied* into
each stage that runs it, the copy of a module's second call is named with ``torch.export``'s
call suffix (``blocks.0@1``), and a stage keeps leftovers of modules it never runs (the head's
original weight in the first stage). Left so, each stage trains its own copy and checkpoints
hold made-up names.

Here, as in Megatron-style pipelines, every tensor a stage *runs* is mapped back to the unsplit
model's tensor (by identity, or by its name without the call suffix) and known by that tensor's
first name (``named_parameters(remove_duplicate=False)`` order):

- on one process, every stage running it shares one object (its gradient accumulates there);
- across processes, each holder keeps its own copy, equal at the start (torch copied it from the
  unsplit model); after the backward the holders' gradients are summed (one all-reduce), so every
  holder's optimizer step is the same step and the copies stay bitwise equal;
- the process of the lowest stage holding it counts it in the gradient norm, once.

What cannot be mapped back (a name torch made up that names nothing of the model, a copy of
another shape) is refused before training, in one line naming the tensor and its stage.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import chain

import torch
import torch.distributed as dist
from torch import nn

from multigpu.errors import UsageError
from multigpu.torch_compat import own_tensor_tables, unflattened_name

Place = tuple[nn.Module, str]
"""Where a stage holds a tensor: the module, and the attribute's name in it."""


@dataclass(frozen=True, kw_only=True)
class ModelNames:
    """The unsplit model's parameters and buffers by name: what stage tensors map back to."""

    tensors: dict[str, torch.Tensor]
    """Every name (a tied tensor's every name) -> its tensor, parameters first."""
    first: dict[int, str]
    """``id(tensor)`` -> the tensor's first name."""
    aliases: dict[str, list[str]]
    """First name -> every name of that tensor, in the model's order."""
    persistent: frozenset[str]
    """The names the model's ``state_dict`` holds (buffers may be non-persistent)."""
    order: tuple[str, ...]
    """The model's ``state_dict`` keys, in order."""

    @classmethod
    def of(cls, model: nn.Module) -> ModelNames:
        named = chain(
            model.named_parameters(remove_duplicate=False),
            model.named_buffers(remove_duplicate=False),
        )
        tensors: dict[str, torch.Tensor] = {}
        first: dict[int, str] = {}
        aliases: dict[str, list[str]] = {}
        for name, tensor in named:
            tensors[name] = tensor
            head = first.setdefault(id(tensor), name)
            aliases.setdefault(head, []).append(name)
        keys = tuple(model.state_dict(keep_vars=True))
        return cls(
            tensors=tensors,
            first=first,
            aliases=aliases,
            persistent=frozenset(keys),
            order=keys,
        )

    def tied(self) -> dict[str, str]:
        """``{later name: first name}`` of every tensor the model holds under several names."""
        return {alias: head for head, names in self.aliases.items() for alias in names[1:]}

    def is_parameter(self, name: str) -> bool:
        return isinstance(self.tensors[name], nn.Parameter)

    def logical(self, qualname: str, tensor: torch.Tensor) -> str | None:
        """The first name of the model's tensor that ``tensor`` (at ``qualname`` in a stage) is,
        or is a copy of; None when it maps to none."""
        if id(tensor) in self.first:
            return self.first[id(tensor)]
        original = self.tensors.get(unflattened_name(qualname))
        return None if original is None else self.first[id(original)]


def live_tensors(stage: nn.Module) -> dict[str, tuple[nn.Module, str, torch.Tensor]]:
    """``{qualified name: (module, attribute, tensor)}`` of the parameters and buffers that
    ``stage``'s traced graphs read; a module called without a graph counts whole."""
    found: dict[str, tuple[nn.Module, str, torch.Tensor]] = {}

    def whole(module: nn.Module, prefix: str) -> None:
        for name, tensor in chain(module.named_parameters(), module.named_buffers()):
            path, _, attr = name.rpartition(".")
            found[prefix + name] = (module.get_submodule(path), attr, tensor)

    def walk(module: nn.Module, prefix: str) -> None:
        graph = getattr(module, "graph", None)
        if not isinstance(graph, torch.fx.Graph):
            whole(module, prefix)
            return
        for node in graph.nodes:
            if node.op == "call_module":
                walk(module.get_submodule(node.target), f"{prefix}{node.target}.")
            elif node.op == "get_attr":
                path, _, attr = str(node.target).rpartition(".")
                owner = module.get_submodule(path)
                value = getattr(owner, attr)
                tables = own_tensor_tables(owner)
                if isinstance(value, nn.Module):
                    walk(value, f"{prefix}{node.target}.")
                elif attr in tables["param"] or attr in tables["buffer"]:  # not a constant
                    found[f"{prefix}{node.target}"] = (owner, attr, value)

    walk(stage, "")
    return found


def _stage_tensors(
    index: int, stage: nn.Module, names: ModelNames
) -> dict[str, list[tuple[Place, torch.Tensor]]]:
    """``{first name: [(place, tensor)]}`` of what stage ``index`` runs, or a UsageError."""
    out: dict[str, list[tuple[Place, torch.Tensor]]] = {}
    for qualname, (owner, attr, tensor) in live_tensors(stage).items():
        logical = names.logical(qualname, tensor)
        if logical is None or names.tensors[logical].shape != tensor.shape:
            what = (
                "names no tensor of the model"
                if logical is None
                else (
                    f"has shape {tuple(tensor.shape)}, not {logical}'s "
                    f"{tuple(names.tensors[logical].shape)}"
                )
            )
            raise UsageError(
                f"pipeline stage {index} runs {qualname!r}, which {what}, so it cannot be kept "
                "equal to the unsplit model's; choose split points that keep the modules using "
                "it in one stage, or train without strategy='pipeline'"
            )
        out.setdefault(logical, []).append(((owner, attr), tensor))
    return out


class SharedTensors:
    """Which stages run each tensor of the model, and this process's one object for each.

    Built from every stage of the first trace (each process traces the whole model, so each
    knows every stage's tensors); binds this process's stages to its objects (``bind``: again
    for each later trace, whose copies would otherwise be stale).
    """

    def __init__(
        self,
        names: ModelNames,
        stages: Mapping[int, nn.Module],
        *,
        local: list[int],
        processes: int,
    ) -> None:
        self.names = names
        self.processes = processes
        self.local = local
        self.rank = local[0] % processes
        found = {i: _stage_tensors(i, module, names) for i, module in sorted(stages.items())}
        self.holders: dict[str, list[int]] = {}
        for index, tensors in found.items():
            for logical in tensors:
                self.holders.setdefault(logical, []).append(index)
        self.held: dict[str, torch.Tensor] = {}
        self._bind_found({i: found[i] for i in local})
        self.crossing = sorted(
            logical
            for logical, stages_of in self.holders.items()
            if len({s % processes for s in stages_of}) > 1
            and names.tensors[logical].requires_grad
            and names.is_parameter(logical)
        )
        """Trained parameters held on several processes: their gradients are summed."""

    def shared(self) -> dict[str, list[int]]:
        """``{first name: stages}`` of the tensors run by more than one stage."""
        return {k: v for k, v in self.holders.items() if len(v) > 1}

    def describe(self) -> str:
        """The shared tensors in one line, e.g. ``emb.weight (= head.weight): stages 0, 1``."""
        parts = []
        for logical, stages_of in self.shared().items():
            also = self.names.aliases[logical][1:]
            named = f"{logical} (= {', '.join(also)})" if also else logical
            parts.append(f"{named}: stages {', '.join(map(str, stages_of))}")
        return "; ".join(parts)

    def bind(self, stages: Mapping[int, nn.Module]) -> None:
        """Point this process's ``stages`` (of any trace) at its one object per tensor."""
        self._bind_found({i: _stage_tensors(i, m, self.names) for i, m in stages.items()})

    def _bind_found(self, found: Mapping[int, dict[str, list[tuple[Place, torch.Tensor]]]]) -> None:
        for index in sorted(found):
            for logical, places in found[index].items():
                kept = self.held.setdefault(logical, places[0][1])
                for (owner, attr), tensor in places:
                    if tensor is not kept:
                        tables = own_tensor_tables(owner)
                        table = tables["param"] if attr in tables["param"] else tables["buffer"]
                        table[attr] = kept

    def counted(self) -> list[torch.Tensor]:
        """This process's parameters that its part of the gradient norm counts: a tensor held on
        several processes counts on the one holding its lowest stage."""
        return [
            tensor
            for logical, tensor in self.held.items()
            if isinstance(tensor, nn.Parameter)
            and (logical not in self.crossing or self._owner(logical) == self.rank)
        ]

    def _owner(self, logical: str) -> int:
        return self.holders[logical][0] % self.processes

    def sum_gradients(self, device: torch.device) -> None:
        """Sum the gradients of the parameters held on several processes, on every holder
        (collective: every process joins, contributing zeros for what it does not hold)."""
        by_dtype: dict[torch.dtype, list[str]] = {}
        for logical in self.crossing:
            by_dtype.setdefault(self.names.tensors[logical].dtype, []).append(logical)
        for dtype, logicals in by_dtype.items():
            pieces = []
            for logical in logicals:
                tensor = self.held.get(logical)
                if tensor is not None and tensor.grad is not None:
                    pieces.append(tensor.grad.reshape(-1))
                else:
                    size = self.names.tensors[logical].numel()
                    pieces.append(torch.zeros(size, dtype=dtype, device=device))
            flat = torch.cat(pieces)
            dist.all_reduce(flat)
            offset = 0
            for logical in logicals:
                size = self.names.tensors[logical].numel()
                tensor = self.held.get(logical)
                if tensor is not None:
                    summed = flat[offset : offset + size].view_as(tensor)
                    if tensor.grad is None:
                        tensor.grad = summed.clone()
                    else:
                        tensor.grad.copy_(summed)
                offset += size

    def plain_view(self) -> nn.Module:
        """One module holding this process's tensors under every name the unsplit model gives
        them (tied as there), in its order: what optimizers and checkpoints see."""
        root = nn.Module()
        for name in chain(self.names.order, self.names.tensors):
            logical = self.names.first[id(self.names.tensors[name])]
            tensor = self.held.get(logical)
            if tensor is None or _has(root, name):
                continue
            leaf = name.rsplit(".", 1)[-1]
            if isinstance(tensor, nn.Parameter):
                _place(root, name).register_parameter(leaf, tensor)
            else:
                persistent = name in self.names.persistent
                _place(root, name).register_buffer(leaf, tensor, persistent=persistent)
        return root


def unique(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """``tensors`` without repeats (by identity), in order."""
    seen: dict[int, torch.Tensor] = {}
    for tensor in tensors:
        seen.setdefault(id(tensor), tensor)
    return list(seen.values())


def _has(root: nn.Module, name: str) -> bool:
    path, _, leaf = name.rpartition(".")
    try:
        module = root.get_submodule(path)
    except AttributeError:
        return False
    tables = own_tensor_tables(module)
    return leaf in tables["param"] or leaf in tables["buffer"]


def _place(root: nn.Module, name: str) -> nn.Module:
    node = root
    for part in name.split(".")[:-1]:
        child = getattr(node, part, None)
        if not isinstance(child, nn.Module):
            child = nn.Module()
            node.add_module(part, child)
        node = child
    return node

"""Models built on the meta device (``ctx.init_module()``), made real: allocate, then initialise.

A meta model holds no memory. ``materialize`` allocates each tensor where the strategy put it —
whole on the device, or only this rank's shard after FSDP's ``fully_shard`` — then initialises it
with its module's own ``reset_parameters()``. The initial values are drawn on the CPU into a
whole, temporary copy of one module's tensors at a time and this rank's piece is copied out, so:

- the weights are the ones ``model = Net()`` would have drawn with the same seed, whatever the
  world size and strategy (children are initialised before their parent, in registration order,
  as their constructors ran); DTensor's own random ops cannot promise that on CPU processes,
  where they even give every shard the same values;
- the peak memory is one module's tensors whole, never the model's.

Every module that owns parameters or buffers must have ``reset_parameters()`` (torch's layers
do; ``nn.MultiheadAttention``'s ``_reset_parameters`` counts): anything else would be left as
uninitialised memory, so it is refused before anything is allocated.

A Hugging Face model (a ``PreTrainedModel`` anywhere in the tree) is initialised as its own
``post_init`` does: each module's ``reset_parameters()`` where it has one, then the model's
``_init_weights`` of it and (transformers 5) of each module above it, module by module on the
same whole copies. Its values are then those
of the model's initialisation scheme, not the very numbers of an eager build (which draws every
constructor's default first): a run that starts from pretrained weights loads them after
``ctx.setup``. A tensor the scheme leaves untouched is refused by name, never trained as
uninitialised memory; every tensor already made real is marked as initialised meanwhile
(transformers' own flag), so a parent never draws over another module's shard.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from multigpu.errors import UsageError
from multigpu.torch_compat import distribute_like, is_dtensor, own_tensor_tables

log = logging.getLogger(__name__)


def has_meta_tensors(module: nn.Module) -> bool:
    """Whether any parameter or buffer of ``module`` is on the meta device."""
    return any(t.is_meta for t in (*module.parameters(), *module.buffers()))


def _post_order(module: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """Every submodule once, children before their parent (the order their constructors ran)."""
    seen: set[int] = set()

    def walk(mod: nn.Module, path: str) -> Iterator[tuple[str, nn.Module]]:
        if id(mod) in seen:
            return
        seen.add(id(mod))
        for name, child in mod.named_children():
            yield from walk(child, f"{path}.{name}" if path else name)
        yield path, mod

    yield from walk(module, "")


def _own_tensors(module: nn.Module) -> list[tuple[str, str]]:
    """(kind, name) of the parameters and buffers ``module`` registers itself."""
    return [
        (kind, name)
        for kind, table in own_tensor_tables(module).items()
        for name, tensor in table.items()
        if tensor is not None
    ]


HfInit = Callable[[nn.Module], object]
"""A Hugging Face model's ``_init_weights``: initialises the module it is given."""

_HF_DONE = "_is_hf_initialized"  # transformers' init functions skip a tensor that carries it


def _is_hf_model(module: nn.Module) -> bool:
    return callable(getattr(module, "_init_weights", None)) and any(
        cls.__name__ == "PreTrainedModel" for cls in type(module).__mro__
    )


def hf_initializers(module: nn.Module) -> dict[int, HfInit]:
    """``id(submodule)`` → how its Hugging Face model initialises it, as ``post_init`` would:
    the model's ``_init_weights(submodule)``, then (transformers 5, whose init functions skip a
    marked tensor) ``_init_weights`` of each module above it in that model, nearest first — a
    parent may draw its children again (GPT-2's attention scales its ``c_proj`` by the depth).
    While that runs, every tensor already made real is marked, so only this module's are drawn.
    """
    found: dict[int, HfInit] = {}
    parents_too = sys.modules.get("transformers.initialization") is not None

    def scheme(init: HfInit, above: tuple[nn.Module, ...]) -> HfInit:
        def run(mod: nn.Module) -> None:
            init(mod)
            for parent in above if parents_too else ():
                init(parent)

        return run

    def walk(mod: nn.Module, init: HfInit | None, above: tuple[nn.Module, ...]) -> None:
        if _is_hf_model(mod):
            init = mod._init_weights  # type: ignore[assignment]
            above = ()
        if init is not None and id(mod) not in found:
            found[id(mod)] = scheme(init, above)
        for child in mod.children():
            walk(child, init, (mod, *above))

    walk(module, None, ())
    return found


def _initializer(module: nn.Module, hf: HfInit | None = None) -> Callable[[], object] | None:
    reset = None
    for name in ("reset_parameters", "_reset_parameters"):
        fn = getattr(module, name, None)
        if callable(fn):
            reset = fn
            break
    if hf is None:
        return reset

    def post_init() -> None:  # what a Hugging Face model's constructor and post_init do
        if reset is not None:
            reset()
        hf(module)

    return post_init


def check_initializable(module: nn.Module, hf: dict[int, HfInit] | None = None) -> None:
    """Refuse a meta model some of whose tensors no ``reset_parameters()`` would initialise
    (``hf``: ``hf_initializers(module)``, when the caller has it already)."""
    hf = hf_initializers(module) if hf is None else hf
    lacking = [
        f"{path or '<root>'} ({type(mod).__name__}: {', '.join(n for _, n in own)})"
        for path, mod in _post_order(module)
        if (own := _own_tensors(mod)) and _initializer(mod, hf.get(id(mod))) is None
    ]
    if lacking:
        more = f"; and {len(lacking) - 4} more" if len(lacking) > 4 else ""
        shown = "; ".join(lacking[:4]) + more
        raise UsageError(
            f"the model was built on the meta device (ctx.init_module()), but these modules own "
            f"tensors and have no reset_parameters() to initialise them: {shown}; give each a "
            "reset_parameters() that sets its own tensors, or build the model outside "
            "ctx.init_module()"
        )


def materialize(module: nn.Module, device: torch.device, *, checked: bool = False) -> None:
    """Allocate ``module``'s meta tensors on ``device`` (shards for DTensors) and initialise them.

    Call it after the module is wrapped or sharded: only what this rank holds is allocated.
    Initial values come from the CPU generator, drawn as ``reset_parameters()`` would draw them
    in a plain one-process build (see the module doc). ``checked``: the caller ran
    ``check_initializable`` already (before its collectives).
    """
    hf = hf_initializers(module)
    if not checked:
        check_initializable(module, hf)
    ties = _tied_parameters(module)
    module.to_empty(device=device)
    _retie(ties)
    # Under a Hugging Face model, a parent's _init_weights draws only the whole copies of the
    # module being initialised: every live tensor is marked as transformers marks a done one.
    marked = [*module.parameters(), *module.buffers()] if hf else []
    for tensor in marked:
        setattr(tensor, _HF_DONE, True)
    done: set[int] = set()  # a tied tensor keeps the values of the first module that set it
    try:
        with torch.no_grad():
            for path, mod in _post_order(module):
                if own := _own_tensors(mod):
                    _initialise_whole(mod, own, path, hf.get(id(mod)), done)
    finally:
        for tensor in marked:
            with contextlib.suppress(AttributeError):
                delattr(tensor, _HF_DONE)


def _tied_parameters(module: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """The (module, name) holders of each parameter held under several names (tied weights)."""
    holders: dict[int, list[tuple[nn.Module, str]]] = {}
    for mod in module.modules():
        for name, param in own_tensor_tables(mod)["param"].items():
            if param is not None:
                holders.setdefault(id(param), []).append((mod, name))
    return [group for group in holders.values() if len(group) > 1]


def _retie(ties: list[list[tuple[nn.Module, str]]]) -> None:
    """Tie again what ``to_empty`` untied: it gives each module a new tensor of its own (a
    GPT-2 built in ``ctx.init_module()`` came out with ``lm_head`` and ``wte`` apart, trained
    as two weights); FSDP2's modules keep their ties, and are left as they are."""
    for (first, first_name), *others in ties:
        kept = own_tensor_tables(first)["param"][first_name]
        for mod, name in others:
            if own_tensor_tables(mod)["param"][name] is not kept:
                setattr(mod, name, kept)


def _initialise_whole(
    module: nn.Module, own: list[tuple[str, str]], path: str, hf: HfInit | None, done: set[int]
) -> None:
    """Run ``module``'s initialiser on whole CPU copies of its tensors; copy this rank's part in.

    A tensor in ``done`` (tied, set by an earlier module) is drawn again but not copied: an
    eager build ties after both modules drew, keeping the first one's values.
    """
    tables = own_tensor_tables(module)
    live: dict[str, Any] = {}
    for kind, name in own:
        tensor = tables[kind][name]
        live[name] = tensor
        whole = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu")
        if hf is not None:  # what the scheme leaves untouched must show: NaN, refused below
            whole.fill_(float("nan") if whole.is_floating_point() else 0)
        if kind == "param":
            tables[kind][name] = nn.Parameter(whole, requires_grad=tensor.requires_grad)
        else:
            tables[kind][name] = whole
    try:
        init = _initializer(module, hf)
        assert init is not None  # check_initializable ran first
        init()
        if hf is not None:
            _refuse_untouched(module, own, path)
        for kind, name in own:
            whole = tables[kind][name].detach()
            target = live[name]
            if id(target) in done:
                continue
            done.add(id(target))
            if is_dtensor(target):
                target.to_local().copy_(distribute_like(whole, target))
            else:
                target.copy_(whole)
    finally:
        for kind, name in own:
            tables[kind][name] = live[name]


def _refuse_untouched(module: nn.Module, own: list[tuple[str, str]], path: str) -> None:
    tables = own_tensor_tables(module)
    left = [
        f"{path}.{name}" if path else name
        for kind, name in own
        if tables[kind][name].is_floating_point() and bool(tables[kind][name].isnan().any())
    ]
    if left:
        raise UsageError(
            f"the model was built on the meta device (ctx.init_module()), and its Hugging Face "
            f"initialisation (reset_parameters(), then _init_weights) left {', '.join(left)} "
            f"({type(module).__name__}) uninitialised; build the model outside "
            "ctx.init_module(), or give that module a reset_parameters()"
        )


def place(module: nn.Module, device: torch.device) -> nn.Module:
    """``module`` on ``device``: moved, or materialized there when it was built on meta."""
    if has_meta_tensors(module):
        materialize(module, device)
        return module
    return module.to(device)


class MetaRng:
    """Makes a materialized model's values those an eager build would have drawn.

    ``ctx.init_module()`` calls ``remember()`` as the model is built (on meta: nothing drawn);
    ``ctx.setup`` initialises inside ``drawing(model)``, from the remembered RNG state — the
    state an eager build would have started from. When nothing was drawn in between, the
    generator ends where the eager build would have left it, so the rest of the run (data
    order, dropout) is the same too; otherwise the draws made in between are kept.
    """

    def __init__(self) -> None:
        self._at_build: torch.Tensor | None = None

    def remember(self) -> None:
        """Note the CPU generator's state at the start of a meta build."""
        self._at_build = torch.get_rng_state()

    @contextlib.contextmanager
    def drawing(self, model: nn.Module) -> Iterator[None]:
        """Run the block (which materializes ``model``) from the remembered state, if any."""
        remembered, self._at_build = self._at_build, None
        if remembered is None or not has_meta_tensors(model):
            yield
            return
        now = torch.get_rng_state()
        torch.set_rng_state(remembered)
        try:
            yield
        finally:
            if not torch.equal(now, remembered):
                torch.set_rng_state(now)

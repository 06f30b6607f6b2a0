"""The model a training script builds, for ``multigpu estimate path/to/train.py``.

A script written against the README (``with multigpu.init() as ctx:``, then
``ctx.setup(model, optimizer)``) has no factory to name: ``multigpu estimate examples/minimal.py``
was refused. Here the script runs as ``python train.py`` would run it (``__main__``, no
arguments), up to its ``ctx.setup``, and stops there: ``multigpu.init()`` is the real one (one
process), after which every tensor is made on the meta device — the model, and the data made in
the script — so nothing is allocated, however large the model; ``ctx.setup`` hands back what it
was given instead of training. The optimizer it was given is the one estimated (unless
``--optimizer`` says otherwise).
"""

from __future__ import annotations

import contextlib
import runpy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from multigpu.errors import UsageError


class _Built(BaseException):
    """What ``ctx.setup`` was given; a BaseException so that a script's ``except Exception``
    does not take it for its own error."""

    def __init__(self, model: Any, optimizers: tuple[Any, ...]) -> None:
        super().__init__("ctx.setup reached")
        self.model, self.optimizers = model, optimizers


@contextlib.contextmanager
def _stopping_at_setup(path: Path) -> Iterator[None]:
    import multigpu
    from multigpu.session.context import Context

    real_init, real_setup = multigpu.init, Context.setup
    before_device = torch.get_default_device()
    argv, sys_path = sys.argv, list(sys.path)

    def init(*args: Any, **kwargs: Any) -> Any:
        ctx = real_init(*args, **kwargs)
        torch.set_default_device("meta")  # after init's own tensors: from here, nothing real
        return ctx

    def setup(self: Any, model: nn.Module, *optimizers: Any, **kwargs: Any) -> Any:
        raise _Built(model, optimizers)

    multigpu.init = init
    Context.setup = setup  # type: ignore[method-assign]
    sys.argv = [str(path)]
    sys.path.insert(0, str(path.parent.resolve()))  # its own imports, as `python file` would
    try:
        yield
    finally:
        multigpu.init, Context.setup = real_init, real_setup  # type: ignore[method-assign]
        sys.argv, sys.path[:] = argv, sys_path
        torch.set_default_device(before_device)


def model_of_script(where: str) -> tuple[nn.Module, Any | None]:
    """The model (on the meta device) and the first optimizer that the script ``where`` gives
    ``ctx.setup``, the script run as ``__main__`` up to there.

    Raises:
        UsageError: the file does not exist, the script fails before its ``ctx.setup`` (on the
            meta device nothing can be read back: ``.item()``, a loaded checkpoint) or ends
            without calling it; the fix (a factory) in one line.
    """
    path = Path(where)
    if not path.is_file():
        raise UsageError(f"{where} does not exist; expected a training script or a model file")
    fix = f"or name a function of it that returns the model: multigpu estimate {where}:build"
    try:
        with _stopping_at_setup(path):
            runpy.run_path(str(path), run_name="__main__")
    except _Built as built:
        if not isinstance(built.model, nn.Module):
            raise UsageError(
                f"{where} gave ctx.setup a {type(built.model).__name__}; expected an nn.Module"
            ) from None
        first = next((o for o in built.optimizers if isinstance(o, torch.optim.Optimizer)), None)
        return built.model, first
    except SystemExit as e:
        raise UsageError(
            f"{where} exited (code {e.code}) before its ctx.setup(model, ...); expected a script "
            f"that builds its model with no arguments, {fix}"
        ) from None
    except Exception as e:  # the user's script: which and why, in one line
        said = " ".join(str(e).split())[:200]
        raise UsageError(
            f"{where} raised {type(e).__name__} before its ctx.setup(model, ...), run with every "
            f"tensor on the meta device: {said}; keep what reads data or values after "
            f"ctx.setup, {fix}"
        ) from e
    raise UsageError(f"{where} ran to its end without calling ctx.setup(model, ...); {fix}")

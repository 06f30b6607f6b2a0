"""The ``MULTIGPU_*`` variables a user sets, read one way: a bad value is a one-line UsageError.

Each reader takes the environment (a mapping) and the variable's name, returns its value or the
default when it is unset or empty, and refuses anything else with a message that names the
variable, the value, what is allowed and how to fix it. The modules that act on a variable
(``initialize``, ``device``, ``dist``, ``hang.watchdog``, ``cli.main``) read it through these, and
the launcher checks every one (``check_environment``) before any worker starts: the workers
inherit its environment.

``Settings`` is what ``multigpu.init()`` takes from its environment mapping, read once at the top:
``init(environ=...)`` resolves the mapping here and passes the typed values down, so the device
choice, the timeout and the process group never read ``os.environ`` behind the caller's back (a
test, a notebook or an embedding program gives its own mapping and gets exactly that).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from multigpu.common.choices import BACKENDS, COMPRESSIONS, DEVICES, STRATEGY_NAMES, did_you_mean
from multigpu.common.mesh_spec import EXAMPLE, parse_mesh
from multigpu.common.profile_window import parse_window
from multigpu.common.tracker_names import TRACKERS, parse_trackers
from multigpu.errors import UsageError

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _raw(environ: Mapping[str, str], name: str) -> str:
    return environ.get(name, "").strip()


def _refuse(name: str, raw: str, expected: str, example: str) -> UsageError:
    return UsageError(
        f"{name}={raw!r} (from the environment) is not {expected}; "
        f"unset {name} or set e.g. {name}={example}"
    )


def read_choice(
    environ: Mapping[str, str],
    name: str,
    allowed: Sequence[str],
    default: str,
    example: str | None = None,
) -> str:
    """The value of ``name`` in lower case, one of ``allowed``; ``default`` when unset or empty."""
    raw = _raw(environ, name)
    if not raw:
        return default
    if raw.lower() not in allowed:
        close = did_you_mean(raw, allowed)  # "fsdpp": "; did you mean fsdp?", and set that
        suggested = close.removeprefix("; did you mean ").removesuffix("?") or example
        raise _refuse(name, raw, f"one of {', '.join(allowed)}{close}", suggested or allowed[0])
    return raw.lower()


def read_flag(environ: Mapping[str, str], name: str, default: bool) -> bool:
    """``name`` as a yes/no switch (1/0, true/false, yes/no, on/off); ``default`` when unset.

    Any other value (``maybe``) is refused: a switch that silently meant "on" would hide a typo.
    """
    raw = _raw(environ, name)
    if not raw:
        return default
    if raw.lower() in TRUE:
        return True
    if raw.lower() in FALSE:
        return False
    raise _refuse(name, raw, "1 or 0 (also true/false, yes/no, on/off)", "1")


def read_seconds(
    environ: Mapping[str, str], name: str, default: float, example: str = "300"
) -> float:
    """``name`` as a positive finite number of seconds; ``default`` when unset or empty."""
    raw = _raw(environ, name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise _refuse(name, raw, "a positive number of seconds", example)
    return value


def read_count(environ: Mapping[str, str], name: str, default: int = 0) -> int:
    """``name`` as a whole number >= 0 (a count of steps); ``default`` when unset or empty."""
    raw = _raw(environ, name)
    if not raw:
        return default
    if not raw.isdigit():
        raise _refuse(name, raw, "a whole number of steps (0 or more)", "20")
    return int(raw)


def strategy(environ: Mapping[str, str]) -> str:
    """``MULTIGPU_STRATEGY``: the strategy of a script that leaves it to ``init()`` (auto)."""
    return read_choice(environ, "MULTIGPU_STRATEGY", STRATEGY_NAMES, "auto", "ddp")


def backend(environ: Mapping[str, str]) -> str:
    """``MULTIGPU_BACKEND``: ``auto`` (nccl on CUDA, gloo on CPU), ``nccl`` or ``gloo``."""
    return read_choice(environ, "MULTIGPU_BACKEND", ("auto", *BACKENDS), "auto")


def device(environ: Mapping[str, str]) -> str:
    """``MULTIGPU_DEVICE``: ``cpu`` keeps the rank on the CPU; ``auto`` (default): CUDA if any."""
    return read_choice(environ, "MULTIGPU_DEVICE", DEVICES, "auto", "cpu")


def compression(environ: Mapping[str, str]) -> str | None:
    """``MULTIGPU_COMPRESSION``: DDP's gradient compression; None when unset."""
    return read_choice(environ, "MULTIGPU_COMPRESSION", COMPRESSIONS, "", "fp16") or None


def compile_backend(environ: Mapping[str, str]) -> str | None:
    """``MULTIGPU_COMPILE``: the ``torch.compile`` backend of the model's blocks; None: off.

    Unset, ``0``/``false``/``no``/``off``: off; ``1``/``true``/``yes``/``on``: ``inductor``; a
    backend's name (``aot_eager``): that backend (``multigpu.init`` checks that torch has it).

    Example:
        >>> [compile_backend({"MULTIGPU_COMPILE": v}) for v in ("", "0", "1", "aot_eager")]
        [None, None, 'inductor', 'aot_eager']
    """
    raw = _raw(environ, "MULTIGPU_COMPILE")
    if not raw or raw.lower() in FALSE:
        return None
    if raw.lower() in TRUE:
        return "inductor"
    if not (raw[0].isalpha() or raw[0] == "_") or not raw.replace("_", "").isalnum():
        expected = "1 or 0 (also true/false), or a torch.compile backend such as aot_eager"
        raise _refuse("MULTIGPU_COMPILE", raw, expected, "1")
    return raw


def deterministic(environ: Mapping[str, str]) -> bool:
    """``MULTIGPU_DETERMINISTIC``: deterministic algorithms (default off)."""
    return read_flag(environ, "MULTIGPU_DETERMINISTIC", False)


def watchdog(environ: Mapping[str, str]) -> bool:
    """``MULTIGPU_WATCHDOG``: record collectives and explain hangs (default on)."""
    return read_flag(environ, "MULTIGPU_WATCHDOG", True)


def timeout(environ: Mapping[str, str], default: float) -> float:
    """``MULTIGPU_TIMEOUT``: seconds a collective or a launcher's wait may take."""
    return read_seconds(environ, "MULTIGPU_TIMEOUT", default)


def hang_after(environ: Mapping[str, str]) -> float | None:
    """``MULTIGPU_HANG_AFTER``: seconds in one collective before it is reported; None: unset."""
    value = read_seconds(environ, "MULTIGPU_HANG_AFTER", math.inf, "30")
    return None if math.isinf(value) else value


def mesh(environ: Mapping[str, str]) -> dict[str, int] | None:
    """``MULTIGPU_MESH``: the mesh shape (``dp=2,tp=2``, ``replicate=2,shard=4``); None: unset.

    Its sizes are checked against the world size where that is known (the launcher's plan,
    ``multigpu.init``), and its axes against the strategy in the workers.
    """
    raw = _raw(environ, "MULTIGPU_MESH")
    if not raw:
        return None
    name = "MULTIGPU_MESH"
    try:
        return parse_mesh(raw, given_as=name)
    except UsageError as e:  # its reason, in this module's words
        why = str(e).split("; ")[0].removeprefix(f"{name}={raw!r}: ").removeprefix(f"{name}: ")
        raise _refuse(name, raw, f"a mesh shape ({why})", EXAMPLE) from e


def profile(environ: Mapping[str, str]) -> tuple[int, int] | None:
    """``MULTIGPU_PROFILE``: the optimizer steps to trace (``3:5``); None: unset."""
    raw = _raw(environ, "MULTIGPU_PROFILE")
    if not raw:
        return None
    try:
        return parse_window(raw)
    except ValueError as e:
        why = str(e).split("; ")[0].split(": ", 1)[1]  # "the first step is after the last"
        expected = f"a window of optimizer steps FIRST:LAST, counted from 1 ({why})"
        raise _refuse("MULTIGPU_PROFILE", raw, expected, "3:5") from e


def profile_dir(environ: Mapping[str, str]) -> str | None:
    """``MULTIGPU_PROFILE_DIR``: where the traces go (default ``./profile``); None: unset.
    Any path is taken (the profiler creates it), as ``MULTIGPU_CACHE_DIR`` is."""
    return _raw(environ, "MULTIGPU_PROFILE_DIR") or None


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where multigpu keeps what it measured or made once (``bench``'s CPU split, the digits
    split): ``$MULTIGPU_CACHE_DIR``, else ``$XDG_CACHE_HOME/multigpu``, else
    ``~/.cache/multigpu``."""
    env = os.environ if environ is None else environ
    if env.get("MULTIGPU_CACHE_DIR"):
        return Path(env["MULTIGPU_CACHE_DIR"])
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "multigpu"


def log_level(environ: Mapping[str, str], default: str = "INFO") -> str:
    """``MULTIGPU_LOG_LEVEL`` as ``logging`` spells it (``DEBUG`` ... ``CRITICAL``)."""
    return read_choice(environ, "MULTIGPU_LOG_LEVEL", LOG_LEVELS, default.lower(), "info").upper()


def log_to(environ: Mapping[str, str]) -> tuple[str, ...]:
    """``MULTIGPU_LOG_TO``: the experiment trackers (``tensorboard,csv``); () when unset.

    An unknown name or a tracker whose package is missing is refused like any bad value.
    """
    name = "MULTIGPU_LOG_TO"
    raw = _raw(environ, name)
    try:
        return parse_trackers(raw, f"{name}=") if raw else ()
    except UsageError as e:
        if "unknown tracker" not in str(e):
            raise  # a missing package: its message says what to install
        why = str(e).split(": ", 1)[1].split("; ")[0]
        raise _refuse(name, raw, f"a list of {', '.join(TRACKERS)} ({why})", "tensorboard") from e


def log_dir(environ: Mapping[str, str]) -> str | None:
    """``MULTIGPU_LOG_DIR``: the directory of the trackers' run; None when unset."""
    return _raw(environ, "MULTIGPU_LOG_DIR") or None


CHECKS: Mapping[str, Callable[[Mapping[str, str]], object]] = {
    "MULTIGPU_STRATEGY": strategy,
    "MULTIGPU_BACKEND": backend,
    "MULTIGPU_DEVICE": device,
    "MULTIGPU_COMPRESSION": compression,
    "MULTIGPU_DETERMINISTIC": deterministic,
    "MULTIGPU_COMPILE": compile_backend,
    "MULTIGPU_WATCHDOG": watchdog,
    "MULTIGPU_TIMEOUT": lambda env: timeout(env, 300.0),
    "MULTIGPU_HANG_AFTER": hang_after,
    "MULTIGPU_LOG_LEVEL": log_level,
    "MULTIGPU_MESH": mesh,
    "MULTIGPU_PROFILE": profile,
    "MULTIGPU_LOG_TO": log_to,
}
"""Every variable a user sets that can be wrong, with its reader (``MULTIGPU_LOG_DIR`` takes
any path; the others are set by multigpu itself)."""


def check_environment(environ: Mapping[str, str]) -> None:
    """Read every user-set ``MULTIGPU_*`` variable of ``environ`` once; the first bad one (in
    ``CHECKS`` order) raises UsageError."""
    for read in CHECKS.values():
        read(environ)


DEFAULT_TIMEOUT_S = 300.0
"""A collective's bound when neither ``timeout=`` nor ``MULTIGPU_TIMEOUT`` gives one."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    """The ``MULTIGPU_*`` values (and ``CUDA_VISIBLE_DEVICES``) of one environment, checked."""

    strategy: str
    """``MULTIGPU_STRATEGY`` (``auto`` when unset)."""
    backend: str
    """``MULTIGPU_BACKEND`` (``auto`` when unset)."""
    device: str
    """``MULTIGPU_DEVICE``: ``cpu`` keeps the rank on the CPU; ``auto``: CUDA when present."""
    deterministic: bool
    """``MULTIGPU_DETERMINISTIC``."""
    timeout_s: float
    """``MULTIGPU_TIMEOUT``, else ``DEFAULT_TIMEOUT_S``."""
    cuda_visible_devices: str | None
    """As given (for messages: which GPUs this process was shown)."""
    profile: tuple[int, int] | None = None
    """``MULTIGPU_PROFILE``: the optimizer steps to trace."""
    profile_dir: str | None = None
    """``MULTIGPU_PROFILE_DIR``: where the traces go."""
    log_to: tuple[str, ...] = ()
    """``MULTIGPU_LOG_TO``: the experiment trackers (none when unset)."""
    log_dir: str | None = None
    """``MULTIGPU_LOG_DIR``: the trackers' directory (None: ``init``'s default)."""
    compile: str | None = None
    """``MULTIGPU_COMPILE``: the ``torch.compile`` backend (None: off)."""

    @classmethod
    def read(cls, environ: Mapping[str, str]) -> Settings:
        """Read and check every value ``init()`` uses; the first bad one raises UsageError.

        Variables read later by the hooks (``MULTIGPU_WATCHDOG``, ``MULTIGPU_HANG_AFTER``) and
        by the strategy (``MULTIGPU_COMPRESSION``, ``MULTIGPU_MESH``) are checked here too, so
        a bad value stops ``init()`` before any process group exists.
        """
        check_environment(environ)
        return cls(
            strategy=strategy(environ),
            backend=backend(environ),
            device=device(environ),
            deterministic=deterministic(environ),
            timeout_s=timeout(environ, DEFAULT_TIMEOUT_S),
            cuda_visible_devices=environ.get("CUDA_VISIBLE_DEVICES"),
            profile=profile(environ),
            profile_dir=profile_dir(environ),
            log_to=log_to(environ),
            log_dir=log_dir(environ),
            compile=compile_backend(environ),
        )

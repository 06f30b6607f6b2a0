"""What the built-in jobs' command lines share: writable outputs, checkpoint options, and how a
job ends.

A job (``multigpu.examples.digits``, ``multigpu.examples.lm``) parses its options, trains, and
ends with exit code 0, or 2 and one line on a usage error — said once, by rank 0, since every
rank refuses the same input. No torch here: ``multigpu train`` parses a job's arguments with the
job's own parser (``digits_parser``, ``lm_parser``) before it starts any worker.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from multigpu.common.arguments import positive, profile_arg
from multigpu.common.tracker_names import TRACKERS, parse_trackers
from multigpu.errors import UsageError


def directory_problem(path: Path) -> str | None:
    """Why ``path`` cannot be, or be created as, a directory this process writes in; None if it
    can. Nothing is left behind: the nearest existing directory is tried with a temporary file.

    Example:
        >>> directory_problem(Path("/etc/hostname"))
        '/etc/hostname is a file, not a directory'
    """
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a directory"
    try:  # a real write: permissions, read-only mounts, root squash, /proc and /sys
        fd, name = tempfile.mkstemp(dir=existing, prefix=".multigpu-write-check-")
    except OSError as e:
        return f"{existing} is not writable ({e.strerror})"
    os.close(fd)
    os.unlink(name)
    return None


def add_checkpoint_options(p: argparse.ArgumentParser, *, every: str, resume: str) -> None:
    """``--out`` and the checkpoint options that ``checkpointer`` reads (``every`` and ``resume``:
    the help of ``--checkpoint-every`` and ``--resume``, in the job's words)."""
    add = p.add_argument
    add(
        "--out",
        help="directory for model.pt, metrics.json, loss.png (and checkpoints/); multigpu train "
        "without it: a fresh runs/MODEL/N, with checkpoints",
    )
    add("--checkpoint-every", type=positive(int), help=every)
    add("--checkpoint-dir", help="directory of the checkpoints (default OUT/checkpoints)")
    add("--keep-checkpoints", type=positive(int), default=3, help="newest checkpoints kept (3)")
    add("--resume", default="auto", help=resume)


def add_profile_option(p: argparse.ArgumentParser) -> None:
    """``--profile FIRST:LAST``: trace those optimizer steps into OUT/profile (``profile_dir``)."""
    p.add_argument(
        "--profile",
        type=profile_arg,
        metavar="FIRST:LAST",
        help="trace optimizer steps FIRST to LAST (from 1) with torch.profiler: one Chrome-trace "
        "JSON per rank in OUT/profile (./profile without --out), for ui.perfetto.dev",
    )


def compile_arg(text: str) -> str:
    """``--compile``'s converter: a ``torch.compile`` backend's name (the worker checks that
    torch has it)."""
    if not (text[:1].isalpha() or text[:1] == "_") or not text.replace("_", "").isalnum():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a torch.compile backend name; expected e.g. inductor or aot_eager"
        )
    return text


def add_compile_option(p: argparse.ArgumentParser) -> None:
    """``--compile [BACKEND]``: ``torch.compile`` each block (``init(compile=)``)."""
    p.add_argument(
        "--compile",
        nargs="?",
        const="inductor",
        type=compile_arg,
        metavar="BACKEND",
        help="torch.compile each block of the model, after activation checkpointing and before "
        "FSDP/DDP wrap it (BACKEND: inductor when not given, or e.g. aot_eager); default "
        "MULTIGPU_COMPILE, else off",
    )


def profile_dir(args: argparse.Namespace) -> Path:
    """Where ``--profile`` writes: ``OUT/profile``, or ``./profile`` without ``--out``."""
    return Path(args.out) / "profile" if getattr(args, "out", None) else Path("profile")


def tracker_list(text: str) -> tuple[str, ...]:
    """``--log-to``'s converter: tracker names, refused (one line) when unknown or missing."""
    try:
        return parse_trackers(text, "")
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e).strip()) from None


def add_tracking_option(p: argparse.ArgumentParser) -> None:
    """``--log-to NAMES``: the experiment trackers, writing in ``--out`` (see job_tracking)."""
    p.add_argument(
        "--log-to",
        type=tracker_list,
        metavar="NAMES",
        help=f"experiment trackers, comma-separated: {', '.join(TRACKERS)}; they write in "
        "--out (default MULTIGPU_LOG_DIR, else runs); default MULTIGPU_LOG_TO, else none",
    )


def add_seed_and_accumulation(p: argparse.ArgumentParser, *, seed: str) -> None:
    """``--seed`` (``seed``: its help, in the job's words) and ``--accumulation-steps``."""
    p.add_argument("--seed", type=int, default=0, help=seed)
    p.add_argument(
        "--accumulation-steps",
        type=positive(int),
        default=1,
        help="micro-batches per optimizer step (the global batch stays --batch-size)",
    )


def check_outputs(args: argparse.Namespace, *, writes_outputs: bool = True) -> None:
    """Refuse, before training, a ``--out`` / ``--checkpoint-dir`` / ``--save`` it cannot write.

    Every rank writes its part of a checkpoint, so the checkpoint directory is checked
    everywhere; ``metrics.json`` and the model only rank 0 writes: ``writes_outputs=False``
    (another rank, a node that may not host rank 0) leaves ``--out`` and ``--save`` to it.
    """
    out = getattr(args, "out", None)
    checkpoint_dir = getattr(args, "checkpoint_dir", None)
    save = getattr(args, "save", None)
    wanted = [("--out", out, "metrics.json and model.pt")] if writes_outputs else []
    if checkpoint_dir:
        wanted.append(("--checkpoint-dir", checkpoint_dir, "the checkpoints"))
    elif out and getattr(args, "checkpoint_every", None):
        wanted.append(("--out", str(Path(out) / "checkpoints"), "the checkpoints"))
    for option, given, what in wanted:
        problem = directory_problem(Path(given).absolute()) if given else None
        if problem:
            raise UsageError(
                f"{option} {given}: {problem}; expected a directory (or a path where one can be "
                f"created) that this user can write, for {what}; give another {option}"
            )
    if save and writes_outputs:
        target = Path(save).absolute()
        problem = f"{save} is a directory" if target.is_dir() else directory_problem(target.parent)
        if problem:
            raise UsageError(
                f"--save {save}: {problem}; expected the path of a file in a directory this "
                "user can write; give another --save"
            )


def checkpointer(
    ctx: Any,
    args: argparse.Namespace,
    *,
    every: int,
    per_rank: Mapping[str, Any] | None = None,
    note: Callable[[], str] | None = None,
    **objects: Any,
) -> tuple[Any, int | None]:
    """``ctx.checkpointer`` of ``--checkpoint-every`` / ``--checkpoint-dir`` (None without them)
    and the step it resumed at (None: a fresh start).

    ``every``: the period without ``--checkpoint-every``; ``per_rank``: objects tracked per rank;
    ``note()``: said after the step resumed at. The launcher checks the same options before it
    starts anything; this is for ``python -m`` users.
    """
    directory = args.checkpoint_dir or (Path(args.out) / "checkpoints" if args.out else None)
    if args.checkpoint_every is None and args.checkpoint_dir is None:
        if args.resume not in ("auto", "never"):
            raise UsageError(
                f"--resume {args.resume} needs checkpointing; expected --checkpoint-every N "
                "(and --out or --checkpoint-dir)"
            )
        return None, None
    if directory is None:
        raise UsageError(
            "--checkpoint-every was given without a place for the checkpoints; expected "
            "--out DIR (checkpoints go to DIR/checkpoints) or --checkpoint-dir DIR"
        )
    ckpt = ctx.checkpointer(
        directory, every_steps=args.checkpoint_every or every, keep=args.keep_checkpoints, **objects
    )
    ckpt.track_per_rank(**(per_rank or {}))
    if args.resume == "never":
        latest = ckpt.latest()
        if latest is not None:
            raise UsageError(
                f"--resume never, but {directory} already holds {latest.name}; expected an "
                "empty checkpoint directory: use --resume auto to continue that run, or "
                "another --checkpoint-dir / --out"
            )
        return ckpt, None
    step = ckpt.resume(args.resume)
    if step is not None:
        where = ckpt.latest() if args.resume == "auto" else args.resume
        ctx.print(f"resumed from {where} at step {step}{note() if note else ''}")
    return ckpt, step


def run_job(
    parser: argparse.ArgumentParser,
    train: Callable[[argparse.Namespace], Any],
    argv: list[str] | None,
) -> int:
    """Parse ``argv`` with ``parser`` and ``train``: 0, or 2 with one line on a usage error."""
    first = os.environ.get("RANK", "0") == "0"
    try:
        args = parser.parse_args(argv)
        check_outputs(args, writes_outputs=first)
        train(args)
    except UsageError as e:
        if first:  # the same message on every rank: say it once
            print(f"multigpu train: error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0

"""The text files a language model trains on: which files ``--data PATHS`` names, and in what order.

No torch and no numpy: the launcher lists and checks the sources with it before any worker starts
(``multigpu train --model lm --data PATHS``), and ``multigpu.data.token_file`` tokenizes them.

A path is a file, a directory (every file of a known format under it, recursively, hidden ones
left out) or a glob (``data/*.jsonl``, ``data/**/*.txt``). Formats, by the file's suffix:

- ``.txt`` / ``.text``: one document per file (the whole file, UTF-8);
- ``.jsonl``: one document per line, a JSON object whose text field (``text`` unless named)
  holds the document; empty lines are skipped;
- ``.parquet``: one document per row of the text column (needs ``pyarrow``).

The order is the paths' order, each directory's files sorted by their path: the same on every
run, so the token file's key and its tokens are too.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path

from multigpu.errors import UsageError

FORMATS = {".txt": "text", ".text": "text", ".jsonl": "jsonl", ".parquet": "parquet"}
"""Suffix -> format of the files ``--data`` reads."""

_KNOWN = ", ".join(FORMATS)


def source_format(path: Path) -> str:
    """The format of ``path`` by its suffix (``text``, ``jsonl`` or ``parquet``).

    Example:
        >>> source_format(Path("shard-0001.jsonl"))
        'jsonl'

    Raises:
        UsageError: a suffix that is none of ``FORMATS``.
    """
    found = FORMATS.get(path.suffix.lower())
    if found is None:
        raise UsageError(
            f"--data {path}: a {path.suffix or 'suffix-less'} file is not a format multigpu "
            f"reads; expected one of {_KNOWN} (rename it, or convert it to JSON lines)"
        )
    return found


def _under(directory: Path) -> list[Path]:
    found: list[Path] = []
    for top, subdirs, names in os.walk(directory):
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
        found.extend(
            Path(top, n)
            for n in sorted(names)
            if not n.startswith(".") and Path(n).suffix.lower() in FORMATS
        )
    return found


def list_sources(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The files ``paths`` name, in order, each once.

    Raises:
        UsageError: no paths; a path that does not exist (nor matches as a glob); a file of an
            unknown format; a directory or glob without a file of a known format.
    """
    if not paths:
        raise UsageError(
            f"--data was given no paths; expected files or directories of {_KNOWN} files"
        )
    files: list[Path] = []
    for given in paths:
        text = os.fspath(given)
        path = Path(text)
        if path.is_dir():
            inside = _under(path)
            if not inside:
                raise UsageError(
                    f"--data {text}: the directory holds no {_KNOWN} file; expected a directory "
                    "of text, JSON-lines or parquet files"
                )
            files.extend(inside)
        elif path.is_file():
            source_format(path)
            files.append(path)
        elif glob.has_magic(text):
            matched = sorted(Path(m) for m in glob.glob(text, recursive=True))
            inside = [m for m in matched if m.is_file() and m.suffix.lower() in FORMATS]
            if not inside:
                raise UsageError(
                    f"--data {text}: the pattern matches no {_KNOWN} file; expected a pattern "
                    "such as data/*.jsonl"
                )
            files.extend(inside)
        else:
            raise UsageError(
                f"--data {text}: no such file or directory; expected existing files or "
                f"directories of {_KNOWN} files"
            )
    seen: set[Path] = set()
    unique = []
    for f in files:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


def check_sources(
    paths: Sequence[str | os.PathLike[str]], tokenizer: str | None = None
) -> list[Path]:
    """``list_sources(paths)``, refused when nothing could come of it: every file empty, parquet
    without ``pyarrow``, a ``tokenizer`` path that does not exist. What the launcher checks.

    Raises:
        UsageError: one line, naming the path and what would do.
    """
    files = list_sources(paths)
    if all(f.stat().st_size == 0 for f in files):
        raise UsageError(
            f"--data {' '.join(str(p) for p in paths)}: all {len(files)} file(s) are empty; "
            "expected text to train on"
        )
    parquet = [f for f in files if source_format(f) == "parquet"]
    if parquet and importlib.util.find_spec("pyarrow") is None:
        raise UsageError(
            f"--data {parquet[0]}: reading parquet needs pyarrow, which is not installed; "
            "pip install pyarrow, or give JSON-lines or text files"
        )
    looks_like_a_path = tokenizer and (os.sep in tokenizer or tokenizer.startswith("."))
    if tokenizer and looks_like_a_path and not Path(tokenizer).is_dir():
        raise UsageError(
            f"--tokenizer {tokenizer}: no such directory; expected a directory holding a "
            "Hugging Face tokenizer (tokenizer.json, as save_pretrained writes it) or a "
            "tokenizer name"
        )
    return files

"""The fenced code blocks of README.md and docs/*.md, with the marker that says how each runs.

A block's marker is an HTML comment on the nearest non-blank line before its opening fence:
``<!-- run-by: tests/x/test_y.py::name[, ...] -->`` (an end-to-end test runs it),
``<!-- not-run: reason -->`` (it cannot run here: say why). Unmarked ``python`` blocks are run,
unmarked ``bash`` command lines are parsed by the real command line; ``text`` is output.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LANGUAGES = ("python", "bash", "text")
_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*([a-z-]+)\s*(?::\s*(.*?))?\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its text and its marker (if any)."""

    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marker: str | None  # "run-by", "not-run", or another word (refused by the test)
    marker_text: str

    @property
    def where(self) -> str:
        """``docs/x.md:12``, for test ids and messages."""
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    """README.md and every docs/*.md."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks_of(path: Path) -> list[Block]:
    """Every fenced block of one Markdown file (indented fences inside list items included)."""
    lines = path.read_text().split("\n")
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, lang = opening.group(1), opening.group(2)
        end = next((j for j in range(i + 1, len(lines)) if _FENCE.match(lines[j])), None)
        if end is None:
            raise AssertionError(f"{path}:{i + 1}: a code block that is never closed")
        body = [ln[len(indent) :] if ln.startswith(indent) else ln for ln in lines[i + 1 : end]]
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = _MARKER.match(before)
        found.append(
            Block(
                path=path,
                line=i + 1,
                lang=lang,
                code="\n".join(body) + "\n",
                marker=marker.group(1) if marker else None,
                marker_text=(marker.group(2) or "") if marker else "",
            )
        )
        i = end + 1
    return found


def all_blocks() -> list[Block]:
    """Every block of every documentation file."""
    return [block for path in doc_files() for block in blocks_of(path)]


def command_lines(code: str) -> list[str]:
    """The shell commands of a bash block: continuations (``\\`` or an indented line) joined,
    comments and blanks dropped."""
    commands: list[str] = []
    pending = ""
    for raw in code.split("\n"):
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line and raw[:1].isspace() and commands:  # an indented usage line goes on
            commands[-1] += " " + line
        elif line:
            commands.append(line)
    return commands


def split_command(line: str) -> tuple[dict[str, str], list[str]]:
    """``A=1 multigpu run x`` -> ({"A": "1"}, ["run", "x"]): the variables and multigpu's argv.

    Raises AssertionError for a line that is not a ``multigpu`` command.
    """
    words = shlex.split(line)
    env: dict[str, str] = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    if not words or words[0] != "multigpu":
        raise AssertionError(f"not a multigpu command line: {line!r}")
    return env, words[1:]


def is_synopsis(argv: list[str]) -> bool:
    """A usage line (``[--json]``, ``a|b``, ``...``) rather than a command to run."""
    return any(w.startswith("[") or "|" in w or w in ("...", "[...]") for w in argv)


def help_argv(argv: list[str]) -> list[str]:
    """The ``--help`` call that documents a synopsis line: its subcommand words (and ``--model
    X``, which has its own options), e.g. ``ckpt inspect PATH [--json]`` -> ``ckpt inspect``."""
    head: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "--model" and i + 1 < len(argv):
            head += argv[i : i + 2]
            i += 2
        elif re.fullmatch(r"[a-z][a-z0-9]*", argv[i]):  # k8s too
            head.append(argv[i])
            i += 1
        else:
            break
    return [*head, "--help"]


def options_of(line: str) -> set[str]:
    """Every ``--option`` and ``-o`` a line names."""
    return set(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", line))

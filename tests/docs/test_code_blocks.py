"""Every code block of README.md and docs/*.md runs, is run by a named test, or says why not.

``python`` blocks run as scripts in a temporary directory. In ``bash`` blocks, ``multigpu run``
and ``multigpu train`` command lines run with ``--dry-run`` (parsed and checked by the real
command line, nothing started), other commands run as written, and usage lines (``[--json]``)
must name only options the subcommand's ``--help`` lists. A block before which
``<!-- run-by: tests/x.py::name -->`` stands is run by that test, which must exist; one after
``<!-- not-run: reason -->`` cannot run here, and says why.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.blocks import (
    LANGUAGES,
    ROOT,
    Block,
    all_blocks,
    command_lines,
    help_argv,
    is_synopsis,
    options_of,
    split_command,
)

BLOCKS = all_blocks()
PYTHON = [b for b in BLOCKS if b.lang == "python" and b.marker is None]
BASH = [b for b in BLOCKS if b.lang == "bash" and b.marker is None]
RUNNER = Path(__file__).with_name("cli_runner.py")
DRY_RUN = ("run", "train")  # the subcommands whose --dry-run parses everything, starts nothing


def _env() -> dict[str, str]:
    # The reader's shell has no MULTIGPU_* settings; one per line is added where the docs say.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MULTIGPU_")}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}


def test_every_block_names_its_language() -> None:
    untagged = [f"{b.where} ({b.lang or 'none'})" for b in BLOCKS if b.lang not in LANGUAGES]
    assert not untagged, f"code blocks need one of {LANGUAGES} after the fence: {untagged}"


def test_markers_are_known_and_name_a_test_or_a_reason() -> None:
    problems: list[str] = []
    for block in BLOCKS:
        if block.marker is None:
            continue
        if block.lang == "text":
            problems.append(f"{block.where}: output (text) is never run; drop the marker")
        elif block.marker == "not-run":
            if len(block.marker_text.split()) < 3:
                problems.append(f"{block.where}: not-run needs a reason, got {block.marker_text!r}")
        elif block.marker == "run-by":
            problems += [f"{block.where}: {p}" for p in _missing_tests(block.marker_text)]
        else:
            problems.append(f"{block.where}: unknown marker {block.marker!r}")
    assert not problems, "\n".join(problems)


def _missing_tests(targets: str) -> list[str]:
    missing: list[str] = []
    for target in (t.strip() for t in targets.split(",")):
        file, _, name = target.partition("::")
        path = ROOT / file
        if not (file.startswith("tests/") and name and path.is_file()):
            missing.append(f"run-by {target!r}: expected tests/<file>.py::<test name>")
        elif not re.search(rf"^def {re.escape(name)}\(", path.read_text(), flags=re.M):
            missing.append(f"run-by {target!r}: no test {name} in {file}")
    return missing


@pytest.mark.parametrize("block", PYTHON, ids=[b.where for b in PYTHON])
def test_python_block_runs(block: Block, tmp_path: Path) -> None:
    script = tmp_path / "block.py"
    script.write_text(block.code)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{block.where}:\n{done.stdout}{done.stderr[-3000:]}"


def test_command_lines_parse_and_usage_lines_name_real_options(tmp_path: Path) -> None:
    jobs: list[dict[str, object]] = []
    checks: list[tuple[str, str, set[str]]] = []  # (where, line, options its --help must list)
    for block in BASH:
        for line in command_lines(block.code):
            env, argv = split_command(line)
            if is_synopsis(argv):
                jobs.append({"argv": help_argv(argv), "env": env})
                checks.append((block.where, line, options_of(line)))
            else:
                if argv[0] in DRY_RUN:
                    argv = [argv[0], "--dry-run", *argv[1:]]
                jobs.append({"argv": argv, "env": env})
                checks.append((block.where, line, set()))
    (tmp_path / "train.py").write_text("import multigpu\n")  # the docs' script of the user
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    done = subprocess.run(
        [sys.executable, str(RUNNER), "jobs.json"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    problems: list[str] = []
    for (where, line, options), result in zip(checks, json.loads(done.stdout), strict=True):
        if result["code"] != 0:
            problems.append(f"{where}: `{line}` exited {result['code']}: {result['stderr']}")
        absent = sorted(o for o in options if not _lists(result["stdout"], o))
        if absent:
            problems.append(f"{where}: `{line}` names {absent}, not in its --help")
    assert not problems, "\n".join(problems)


def _lists(help_text: str, option: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", help_text) is not None

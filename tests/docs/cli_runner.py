"""Runs many ``multigpu`` command lines in one process (the import of torch is paid once).

``python cli_runner.py JOBS.json``: JOBS is a list of ``{"argv": [...], "env": {...}}``; each
runs as ``python -m multigpu ARGV`` would, with ENV added to the environment, in the current
directory. Prints one JSON list of ``{"code", "stdout", "stderr"}``, one per job.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import sys


def _run(argv: list[str], env: dict[str, str]) -> dict[str, object]:
    saved_env, saved_argv = dict(os.environ), sys.argv
    os.environ.update(env)
    sys.argv = ["multigpu", *argv]
    out, err = io.StringIO(), io.StringIO()
    code: object = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_module("multigpu", run_name="__main__", alter_sys=True)
    except SystemExit as stop:  # `python -m multigpu` ends with sys.exit(main())
        code = stop.code if stop.code is not None else 0
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv = saved_argv
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


def main() -> None:
    """Run every job of the file named by ``sys.argv[1]``; print the results as JSON."""
    with open(sys.argv[1]) as f:
        jobs = json.load(f)
    results = [_run(job["argv"], job["env"]) for job in jobs]
    sys.stdout.write(json.dumps(results))


if __name__ == "__main__":
    main()

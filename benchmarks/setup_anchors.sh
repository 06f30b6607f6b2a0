#!/usr/bin/env bash
# Create benchmarks/.venv-anchors: torch 2.13.0 (CPU) + Accelerate + Lightning + this repo, for
# benchmarks/overhead.py, which compares multigpu against hand-written DDP, HuggingFace
# Accelerate and Lightning Fabric on the same torch.
#   PYTHON      the interpreter that creates the venv (default python3)
#   TORCH_SPEC  what pip installs for torch (default torch==2.13.0; the CPU wheel here)
# Prints the exact versions installed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
VENV=benchmarks/.venv-anchors
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build.
"${PIP[@]}" "$TORCH_SPEC"
# The constraint keeps accelerate's and lightning's "torch>=..." from replacing that torch.
CONSTRAINTS=$(mktemp)
trap 'rm -f "$CONSTRAINTS"' EXIT
"$VENV/bin/python" -c 'from importlib.metadata import version; print("torch==" + version("torch"))' \
  >"$CONSTRAINTS"
"${PIP[@]}" -c "$CONSTRAINTS" accelerate lightning
"${PIP[@]}" -c "$CONSTRAINTS" -e .
"$VENV/bin/python" - <<'PY'
from importlib.metadata import version
import platform
print("python", platform.python_version())
for name in ("torch", "accelerate", "lightning", "numpy", "multigpu"):
    print(name, version(name))
PY

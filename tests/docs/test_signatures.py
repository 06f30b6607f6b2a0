"""The defaults a doc shows for a public class or function (``multigpu.DDPStrategy(
bucket_cap_mb=None, ...)``) are the code's: read back with ``inspect.signature``."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import multigpu

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# `multigpu.Name(a=1, b="x", ...)` or `Name(a=1, **kwargs)` for a name multigpu exports
SHOWN = re.compile(r"`(?:multigpu\.)?([A-Z]\w+|[a-z_]+)\(([^`()]*=[^`()]*)\)`")


def _shown_defaults(text: str) -> dict[str, object] | None:
    """The keyword=literal pairs of a shown call; None when it is not only such pairs."""
    parts = [p.strip() for p in text.split(",")]
    kept = [p for p in parts if p and p != "..." and not p.startswith("**")]
    try:
        call = ast.parse(f"f({', '.join(kept)})", mode="eval").body
    except SyntaxError:
        return None
    assert isinstance(call, ast.Call)
    if call.args:
        return None
    try:
        return {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg is not None}
    except ValueError:
        return None  # an expression (a variable, a call): an example, not a signature


def _signatures() -> list[tuple[str, str, dict[str, object]]]:
    found = []
    for doc in DOCS:
        for name, args in SHOWN.findall(doc.read_text()):
            target = getattr(multigpu, name, None)
            shown = _shown_defaults(args)
            if target is None or not callable(target) or not shown:
                continue
            if len(shown) >= 4:  # a signature, not an example's call with a few chosen values
                found.append((doc.name, name, shown))
    return found


def test_the_docs_show_some_signatures():
    assert any(name == "DDPStrategy" for _, name, _ in _signatures())


@pytest.mark.parametrize(("doc", "name", "shown"), _signatures())
def test_a_signature_a_doc_shows_has_the_codes_defaults(
    doc: str, name: str, shown: dict[str, object]
):
    params = inspect.signature(getattr(multigpu, name)).parameters
    assert set(shown) <= set(params), f"{doc} shows {name} with {set(shown) - set(params)}"
    actual = {k: params[k].default for k in shown}
    assert shown == actual, f"{doc} shows {name}({shown}); the code has {actual}"

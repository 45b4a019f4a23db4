"""``fr_otel.__all__`` is the user API: README lists exactly those names, and each one resolves."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import fr_otel

README = Path(__file__).resolve().parents[2] / "README.md"
NAME = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)`")


def readme_api(text: str) -> set[str]:
    """The names README's API list gives: every bare `name` from its first line to the kit paragraph."""
    start = text.index("The public API is what `fr_otel.__all__` lists")
    block = text[start:text.index("\n\n", text.index("\n- ", start))]
    return set(NAME.findall(block))


def test_readme_lists_exactly_the_names_of_fr_otel_all() -> None:
    """README's public API list and fr_otel.__all__ name the same ~20 names, none twice in __all__."""
    assert len(fr_otel.__all__) == len(set(fr_otel.__all__))
    assert readme_api(README.read_text(encoding="utf-8")) == set(fr_otel.__all__)


def test_the_readme_check_sees_a_name_missing_or_extra() -> None:
    """The list check can fail: a README that drops `step` or adds `run_incident` differs from __all__."""
    text = README.read_text(encoding="utf-8")
    assert "`step`" in text
    assert readme_api(text.replace("`step`", "step")) == set(fr_otel.__all__) - {"step"}
    extra = text.replace("- `__version__`.", "- `__version__`, `run_incident`.")
    assert readme_api(extra) == {*fr_otel.__all__, "run_incident"}


def test_every_public_name_resolves_in_a_fresh_interpreter() -> None:
    """Each name of fr_otel.__all__ imports from the package root (lazily), and `from fr_otel import *` gives them all."""
    code = ("import fr_otel; missing = [n for n in fr_otel.__all__ if getattr(fr_otel, n, None) is None]; "
            "ns = {}; exec('from fr_otel import *', ns); missing += sorted(set(fr_otel.__all__) - set(ns)); "
            "print(missing)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stderr


def test_a_type_checker_sees_every_public_name() -> None:
    """The package root serves its names lazily (``__getattr__``); the ``if TYPE_CHECKING:`` block imports
    each of them for type checkers (the user's too): it names exactly the lazy table's names."""
    import ast

    import fr_otel

    tree = ast.parse(Path(fr_otel.__file__).read_text(encoding="utf-8"))
    (block,) = [n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", None) == "TYPE_CHECKING"]
    seen = {alias.asname or alias.name for stmt in block.body if isinstance(stmt, ast.ImportFrom) for alias in stmt.names}
    assert seen == set(fr_otel._HOMES)

"""The package layout stays what docs/architecture.md says: layers import downwards, no circles,
no private names across modules, no test machinery in the product, and big modules only by choice.

Static (AST) checks over src/fr_otel: fast, and they see imports inside functions too (a lazy
import is still a dependency).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "fr_otel"

#: Modules allowed over ~400 lines, each with the one concept that needs the room.
#: None today; an entry whose module is back under 400 lines fails the test (the list stays honest).
LARGE_MODULES: dict[str, str] = {}

#: Lower layers first; a module may import its own layer and the layers listed before it.
LAYERS = ["common", "read", "diagnosis", "report", "trace", "otlp", "incident"]

#: Layers on which the analysis path stands: they must never import these, not even lazily.
LIGHT_LAYERS = {"common", "read", "diagnosis", "report"}
HEAVY = ("torch", "grpc", "opentelemetry", "prometheus_client")


@dataclass(frozen=True)
class Import:
    """One imported module (``target``) and the names taken from it, as written in ``source``."""

    source: str
    target: str
    names: tuple[str, ...]
    line: int
    type_checking: bool


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def product_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(name: str, path: Path) -> Iterator[Import]:
    """Every import in the module, relative ones resolved to absolute names."""
    is_package = path.name == "__init__.py"
    here = name.split(".") if is_package else name.split(".")[:-1]

    def walk(node: ast.AST, type_checking: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.body:
                    yield from walk_one(sub, True)
                for sub in child.orelse:
                    yield from walk_one(sub, type_checking)
            else:
                yield from walk_one(child, type_checking)

    def walk_one(node: ast.AST, type_checking: bool) -> Iterator[Import]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(name, alias.name, (), node.lineno, type_checking)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield Import(name, target, tuple(a.name for a in node.names), node.lineno, type_checking)
        yield from walk(node, type_checking)

    yield from walk(ast.parse(path.read_text(encoding="utf-8")), False)


def dependency_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> product modules it imports at run time (``from pkg import mod`` counts as ``pkg.mod``)."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for imp in imports_of(name, path):
            if imp.type_checking or not imp.target.startswith("fr_otel"):
                continue
            targets = [f"{imp.target}.{n}" for n in imp.names if f"{imp.target}.{n}" in modules]
            if len(targets) < len(imp.names) or not imp.names:
                targets.append(imp.target)
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in LAYERS else None


def test_no_import_circle_between_product_modules() -> None:
    """No two product modules import each other, directly or round a loop (lazy imports included)."""
    assert cycles(dependency_graph(product_modules())) == []


def test_the_cycle_finder_sees_a_loop() -> None:
    """The circle check can fail: a two-module loop and a three-module loop are both found."""
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": set()}
    assert cycles(graph) == [["a", "b"], ["c", "d", "e"]]


def upward_imports(modules: dict[str, Path]) -> list[str]:
    """Imports from a layer module into a later layer or into an application module."""
    upward = []
    for name, path in modules.items():
        mine = layer_of(name)
        if mine is None:
            continue
        allowed = set(LAYERS[: LAYERS.index(mine) + 1])
        for imp in imports_of(name, path):
            theirs = layer_of(imp.target + ".x") if imp.target.count(".") == 1 else layer_of(imp.target)
            if imp.target.startswith("fr_otel.") and theirs is None and imp.target.split(".")[1] not in LAYERS:
                if imp.target != "fr_otel.version":
                    upward.append(f"{name}:{imp.line} imports {imp.target} (an application module)")
            elif theirs is not None and theirs not in allowed:
                upward.append(f"{name}:{imp.line} imports {imp.target}")
    return upward


def private_imports(modules: dict[str, Path]) -> list[str]:
    """Imports of another module's private names, another package's private module, or the tests."""
    offences = []
    for name, path in modules.items():
        for imp in imports_of(name, path):
            if imp.target == "tests" or imp.target.startswith("tests.") or imp.target == "conftest":
                offences.append(f"{name}:{imp.line} imports {imp.target}")
            if not imp.target.startswith("fr_otel"):
                continue
            private = [n for n in imp.names if n.startswith("_") and n != "__version__"]
            home = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
            private_module = any(p.startswith("_") for p in imp.target.split(".")[1:])
            if private or (private_module and imp.target.rsplit(".", 1)[0] != home):
                offences.append(f"{name}:{imp.line} imports {imp.target} {private}")
    return offences


def test_layers_import_only_downwards() -> None:
    """A layer package imports only itself and the layers below it (read never reaches into diagnosis...)."""
    assert upward_imports(product_modules()) == []


def test_no_product_module_imports_a_private_name_or_the_tests() -> None:
    """Modules share only public names: no `from x import _y`, no private module of another
    package, and nothing from tests/."""
    assert private_imports(product_modules()) == []


def test_the_import_checks_see_planted_offences(tmp_path: Path) -> None:
    """The layer and private-name checks can fail: a read module reaching into diagnosis, one into
    the watcher, one taking a private name and one importing the tests are all reported."""
    planted = tmp_path / "planted.py"
    planted.write_text("from ..diagnosis.job import Job\nfrom ..watch import DumpWatcher\n"
                       "from .dump import _private\nimport tests.conftest\nfrom .dump import Entry\n")
    modules = {"fr_otel.read.planted": planted}
    assert [o.split(" imports ")[1] for o in upward_imports(modules)] == [
        "fr_otel.diagnosis.job", "fr_otel.watch (an application module)"]
    assert [o.split(" imports ")[1] for o in private_imports(modules)] == [
        "fr_otel.read.dump ['_private']", "tests.conftest"]


def test_the_product_does_not_depend_on_the_test_kit() -> None:
    """Only fr_otel.testing imports fr_otel.testing: the demo, CLI and agent stand on product modules."""
    uses = []
    for name, path in product_modules().items():
        if name == "fr_otel.testing" or name.startswith("fr_otel.testing."):
            continue
        for imp in imports_of(name, path):
            if (imp.target == "fr_otel.testing" or imp.target.startswith("fr_otel.testing.")
                    or (imp.target == "fr_otel" and "testing" in imp.names)):
                uses.append(f"{name}:{imp.line} imports {imp.target} {list(imp.names)}")
    assert uses == []


def test_light_layers_never_import_torch_grpc_or_the_sdk() -> None:
    """read, diagnosis, report and common never import torch, gRPC, OpenTelemetry or prometheus_client,
    not even inside a function, so analysis and reports stay fast and install-light."""
    heavy = []
    for name, path in product_modules().items():
        if layer_of(name) in LIGHT_LAYERS:
            heavy += [f"{name}:{i.line} imports {i.target}" for i in imports_of(name, path)
                      if i.target.split(".")[0] in {h.split(".")[0] for h in HEAVY}]
    assert heavy == []


def test_modules_stay_small_unless_one_concept_needs_the_room() -> None:
    """A module over 400 lines is listed in LARGE_MODULES with the reason; the list holds no stale entry."""
    sizes = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in product_modules().items()}
    unexplained = sorted(f"{n} ({s} lines)" for n, s in sizes.items() if s > 400 and n not in LARGE_MODULES)
    stale = sorted(n for n in LARGE_MODULES if sizes.get(n, 0) <= 400)
    assert (unexplained, stale) == ([], [])


@pytest.mark.parametrize("layer", LAYERS)
def test_every_layer_package_says_what_it_is_for(layer: str) -> None:
    """Each layer folder has an __init__ docstring (what a newcomer reads first)."""
    doc = ast.get_docstring(ast.parse((PACKAGE / layer / "__init__.py").read_text(encoding="utf-8")))
    assert doc and len(doc) > 40

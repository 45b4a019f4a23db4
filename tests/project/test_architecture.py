"""The package layout stays what docs/architecture.md says: layers import downwards, applications
only what their APPLICATIONS row lists, no circles (type-only imports count), no module takes
another's private (``_name``) names, no test machinery in the product, every module opens with its one idea,
and the agent's rooms stay small enough to read alone (a module's size is a review question: one idea per
module, split by idea, never by a line count). The checks read the imports themselves: an internal module's ``__all__`` grants nothing
(only ``fr_otel.__all__`` means something, the user API: tests/project/test_public_api.py).

Static (AST) checks over src/fr_otel: fast, and they see imports inside functions too (a lazy
import is still a dependency). Each import, API, idea and room check has a planted-offence test that
proves it can fail.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "fr_otel"

#: The most modules one folder of the agent holds: a room a newcomer reads alone (the layers are folders of
#: their own, split by reader and writer, not by size).
MAX_AGENT_ROOM = 10

#: Lower layers first; a module may import its own layer and the layers listed before it.
LAYERS = ["common", "read", "diagnosis", "report", "trace", "otlp", "incident"]

#: Everything that is not a layer, and what it may import besides itself and ``fr_otel.version``
#: ("fr_otel" is the package's own __init__, the public API). The CLI sits on top of everything;
#: the agent, the watcher and the scenarios stand on layers only; the demo runs scenarios; the
#: users' test kit (receivers, dump builder, spans) stands on layers only.
ROOT = "fr_otel"
APPLICATIONS: dict[str, set[str]] = {
    ROOT: {*LAYERS, "agent"},
    "cli": {*LAYERS, ROOT, "agent", "watch", "demo", "scenarios"},
    "agent": set(LAYERS),
    "watch": set(LAYERS),
    "demo": {*LAYERS, "scenarios"},
    "scenarios": set(LAYERS),
    "testing": set(LAYERS),
    "version": set(),
}

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


@functools.cache
def known_modules() -> frozenset[str]:
    return frozenset(product_modules())


def is_product(target: str) -> bool:
    return target == ROOT or target.startswith(ROOT + ".")


def targets_of(imp: Import, modules: dict[str, Path]) -> list[str]:
    """The product modules an import reaches: ``from pkg import mod`` is ``pkg.mod`` (``from .. import
    diagnosis`` is ``fr_otel.diagnosis``); a name that is no module is taken from ``imp.target`` itself."""
    if not is_product(imp.target):
        return []
    known = known_modules() | set(modules)
    found = [f"{imp.target}.{n}" for n in imp.names if f"{imp.target}.{n}" in known]
    if len(found) < len(imp.names) or not imp.names:
        found.append(imp.target)
    return found


def dependency_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> product modules it imports, lazily or for type checking too."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for imp in imports_of(name, path):
            graph[name].update(t for t in targets_of(imp, modules) if t in modules and t != name)
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


def unit_of(module: str) -> str:
    """The layer or application a product module belongs to (``fr_otel`` for the package's __init__)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT


def layer_of(module: str) -> str | None:
    unit = unit_of(module)
    return unit if unit in LAYERS else None


def may_import(unit: str) -> set[str]:
    if unit in LAYERS:
        return set(LAYERS[: LAYERS.index(unit) + 1]) | {"version"}
    return APPLICATIONS.get(unit, set()) | {unit, "version"}


def test_no_import_circle_between_product_modules() -> None:
    """No two product modules import each other, directly or round a loop (lazy and type-only imports included)."""
    assert cycles(dependency_graph(product_modules())) == []


def test_the_cycle_finder_sees_a_loop() -> None:
    """The circle check can fail: a two-module loop and a three-module loop are both found."""
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": set()}
    assert cycles(graph) == [["a", "b"], ["c", "d", "e"]]


def test_a_type_only_import_closes_a_circle(tmp_path: Path) -> None:
    """The circle check sees imports under TYPE_CHECKING: they are dependencies of the reader too."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from .b import B\n")
    b.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\n")
    assert cycles(dependency_graph({"fr_otel.read.a": a, "fr_otel.read.b": b})) == [["fr_otel.read.a", "fr_otel.read.b"]]


def wrong_way_imports(modules: dict[str, Path]) -> list[str]:
    """Imports against the direction rule: a layer into a later layer or an application, an
    application into one that its APPLICATIONS row does not list."""
    wrong = []
    for name, path in modules.items():
        mine = unit_of(name)
        if mine not in LAYERS and mine not in APPLICATIONS:
            wrong.append(f"{name} belongs to {mine}, which is neither in LAYERS nor in APPLICATIONS")
            continue
        allowed = may_import(mine)
        for imp in imports_of(name, path):
            for target in targets_of(imp, modules):
                theirs = unit_of(target)
                if theirs not in allowed:
                    kind = "" if theirs in LAYERS else " (an application module)"
                    wrong.append(f"{name}:{imp.line} imports {target}{kind}")
    return wrong


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


#: The public API of named tuples, spelt with a leading underscore.
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}


def private_imports(modules: dict[str, Path]) -> list[str]:
    """Imports of another module's private names, another package's private module, or the tests."""
    offences = []
    for name, path in modules.items():
        home = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for imp in imports_of(name, path):
            if imp.target.split(".")[0] in ("tests", "conftest"):
                offences.append(f"{name}:{imp.line} imports {imp.target}")
            targets = targets_of(imp, modules)
            private = [n for n in imp.names if is_private(n) and f"{imp.target}.{n}" not in targets]
            if private:
                offences.append(f"{name}:{imp.line} imports {imp.target} {private}")
            for target in targets:
                if any(is_private(p) for p in target.split(".")[1:]) and target.rsplit(".", 1)[0] != home:
                    offences.append(f"{name}:{imp.line} imports {target} (a private module)")
    return offences


def _module_names(name: str, path: Path, tree: ast.AST, modules: dict[str, Path]) -> set[str]:
    """Names this module binds to product modules (``from . import reader``, ``import fr_otel.x as y``)."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound |= {a.asname for a in node.names if a.asname and is_product(a.name)}
            bound |= {ROOT for a in node.names if not a.asname and is_product(a.name)}
    for imp in imports_of(name, path):
        bound |= {t.split(".")[-1] for t in targets_of(imp, modules) if t.split(".")[-1] in imp.names}
    aliases = {a.name: a.asname for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               for a in node.names if a.asname}
    return {aliases.get(b, b) for b in bound}


def _own_private_attributes(tree: ast.AST) -> set[str]:
    """Private attributes this module defines: ``self._x = ...``, class-level ``_x``, methods ``_x``."""
    own = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            own.add(node.attr)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                targets = item.targets if isinstance(item, ast.Assign) else [getattr(item, "target", None)]
                own |= {t.id for t in targets if isinstance(t, ast.Name)}
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    own.add(item.name)
    return own


def private_attribute_uses(modules: dict[str, Path]) -> list[str]:
    """Private names reached without an import: ``reader._LIMIT`` or ``getattr(reader, "_LIMIT")`` on
    an imported product module, and ``obj._x = ...`` writing a private attribute this module does
    not define (another module's object)."""
    offences = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        bound = _module_names(name, path, tree, modules)
        own = _own_private_attributes(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and is_private(node.attr) and node.attr not in NAMEDTUPLE_API:
                on_module = isinstance(node.value, ast.Name) and node.value.id in bound
                on_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
                if on_module or (isinstance(node.ctx, ast.Store) and not on_self and node.attr not in own):
                    offences.append(f"{name}:{node.lineno} uses {ast.unparse(node)}")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2
                    and isinstance(node.args[0], ast.Name) and node.args[0].id in bound
                    and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
                    and is_private(node.args[1].value)):
                offences.append(f"{name}:{node.lineno} uses {ast.unparse(node)}")
    return offences


def test_layers_import_only_downwards_and_applications_only_what_their_row_lists() -> None:
    """A layer imports only itself and the layers below it (read never reaches into diagnosis...);
    an application only what APPLICATIONS lists (the agent never imports the CLI or the watcher)."""
    assert wrong_way_imports(product_modules()) == []


def test_no_product_module_imports_a_private_name_or_the_tests() -> None:
    """Modules share only public names: no `from x import _y`, no private module of another
    package, and nothing from tests/."""
    assert private_imports(product_modules()) == []


def test_no_product_module_reaches_a_private_name_through_an_attribute() -> None:
    """No `module._name`, `getattr(module, "_name")` on another product module, and no writing
    another module's objects' private attributes (`dump._loader = ...`): they are the owner's business."""
    assert private_attribute_uses(product_modules()) == []


def test_the_import_checks_see_planted_offences(tmp_path: Path) -> None:
    """The direction and private-name checks can fail: a read module reaching into diagnosis, into
    the watcher (also as `from .. import watch` and `from fr_otel import diagnosis`), taking a private
    name, a private module of another package, and importing the tests are all reported."""
    planted = tmp_path / "planted.py"
    planted.write_text("from ..diagnosis.job import Job\nfrom ..watch import DumpWatcher\n"
                       "from .. import watch\nfrom fr_otel import diagnosis\n"
                       "from .dump import _private\nimport tests.conftest\nfrom .dump import Entry\n"
                       "from ..cli import _common\n")
    modules = {"fr_otel.read.planted": planted}
    assert [o.split(" imports ")[1] for o in wrong_way_imports(modules)] == [
        "fr_otel.diagnosis.job", "fr_otel.watch (an application module)", "fr_otel.watch (an application module)",
        "fr_otel.diagnosis", "fr_otel.cli._common (an application module)"]
    assert [o.split(" imports ")[1] for o in private_imports(modules)] == [
        "fr_otel.read.dump ['_private']", "tests.conftest", "fr_otel.cli._common (a private module)"]


def test_a_layer_package_init_is_held_to_the_layer_rule(tmp_path: Path) -> None:
    """A layer's __init__.py is part of its layer: read/__init__ importing diagnosis is reported."""
    init = tmp_path / "__init__.py"
    init.write_text("from ..diagnosis import job\n")
    assert wrong_way_imports({"fr_otel.read": init}) == ["fr_otel.read:1 imports fr_otel.diagnosis.job"]


@pytest.mark.parametrize(("unit", "line", "reported"), [
    ("agent", "from ..cli import main", "fr_otel.cli"),
    ("agent", "from ..watch.watcher import DumpWatcher", "fr_otel.watch.watcher"),
    ("watch", "from ..agent import start", "fr_otel.agent"),
    ("scenarios", "from .. import demo", "fr_otel.demo"),
    ("demo", "from ..agent import start", "fr_otel.agent"),
    ("testing", "from ..cli import main", "fr_otel.cli"),
])
def test_an_application_importing_outside_its_row_is_reported(tmp_path: Path, unit: str, line: str,
                                                              reported: str) -> None:
    """The application rule can fail: the agent into the CLI or watcher, the watcher into the agent..."""
    planted = tmp_path / "planted.py"
    planted.write_text(line + "\n")
    assert wrong_way_imports({f"fr_otel.{unit}.planted": planted}) == [
        f"fr_otel.{unit}.planted:1 imports {reported} (an application module)"]


def test_a_package_in_no_table_is_reported(tmp_path: Path) -> None:
    """A new top-level package must be given a row: one that is neither a layer nor an application fails."""
    planted = tmp_path / "planted.py"
    planted.write_text("")
    assert wrong_way_imports({"fr_otel.newthing.planted": planted}) == [
        "fr_otel.newthing.planted belongs to newthing, which is neither in LAYERS nor in APPLICATIONS"]


def test_the_attribute_check_sees_planted_private_uses(tmp_path: Path) -> None:
    """`reader._X`, `getattr(reader, "_X")` and writing another module's object's private attribute
    are reported; the module's own `self._x`, named tuples' `_replace` and stdlib `sys._getframe` are not."""
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import sys\nfrom . import reader\nimport fr_otel.read.dump as d\n"
        "n = reader._PARALLEL_MIN_BYTES\nm = getattr(reader, '_PARALLEL_MIN_BYTES')\nk = d._x\n"
        "def f(dump, e):\n    dump._loader = None\n    return e._replace(pg_name=''), sys._getframe()\n"
        "class C:\n    _y = 1\n    def __init__(self):\n        self._z = 0\n"
        "def g(c):\n    c._z = 1\n    c._y = 2\n")
    assert [o.split(" uses ")[1] for o in private_attribute_uses({"fr_otel.read.planted": planted})] == [
        "reader._PARALLEL_MIN_BYTES", "getattr(reader, '_PARALLEL_MIN_BYTES')", "d._x", "dump._loader"]


def kit_imports(modules: dict[str, Path]) -> list[str]:
    """Imports of fr_otel.testing from outside it."""
    uses = []
    for name, path in modules.items():
        if name == "fr_otel.testing" or name.startswith("fr_otel.testing."):
            continue
        for imp in imports_of(name, path):
            if (imp.target == "fr_otel.testing" or imp.target.startswith("fr_otel.testing.")
                    or (imp.target == "fr_otel" and "testing" in imp.names)):
                uses.append(f"{name}:{imp.line} imports {imp.target} {list(imp.names)}")
    return uses


def heavy_imports(modules: dict[str, Path]) -> list[str]:
    """Imports of torch, gRPC, OpenTelemetry or prometheus_client from the light layers."""
    roots = {h.split(".")[0] for h in HEAVY}
    return [f"{name}:{i.line} imports {i.target}" for name, path in modules.items() if layer_of(name) in LIGHT_LAYERS
            for i in imports_of(name, path) if i.target.split(".")[0] in roots]


def unexplained_modules(modules: dict[str, Path]) -> list[str]:
    """Modules whose docstring does not open with their idea (none, or a few words)."""
    out = []
    for name, path in modules.items():
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        if len(doc.split("\n\n")[0]) < 24:
            out.append(name)
    return out


def crowded_rooms(modules: dict[str, Path], limit: int) -> list[str]:
    """Folders of the agent holding more than ``limit`` modules (``__init__`` not counted)."""
    rooms: dict[str, int] = {}
    for name, path in modules.items():
        if unit_of(name) == "agent" and path.name != "__init__.py":
            room = name.rsplit(".", 1)[0]
            rooms[room] = rooms.get(room, 0) + 1
    return sorted(f"{room} ({n} modules)" for room, n in rooms.items() if n > limit)


def test_the_product_does_not_depend_on_the_test_kit() -> None:
    """Only fr_otel.testing imports fr_otel.testing: the demo, CLI and agent stand on product modules."""
    assert kit_imports(product_modules()) == []


def test_light_layers_never_import_torch_grpc_or_the_sdk() -> None:
    """read, diagnosis, report and common never import torch, gRPC, OpenTelemetry or prometheus_client,
    not even inside a function, so analysis and reports stay fast and install-light."""
    assert heavy_imports(product_modules()) == []


def test_every_module_opens_with_the_one_idea_it_holds() -> None:
    """Each product module's docstring opens with what it is for: a module holds one idea (split by idea, not by
    size; a reviewer reads that sentence against the code)."""
    assert unexplained_modules(product_modules()) == []


def test_no_room_of_the_agent_holds_more_than_ten_modules() -> None:
    """The agent is folders by job (guest, observe, serve, links, incident and its face), each read alone."""
    assert crowded_rooms(product_modules(), MAX_AGENT_ROOM) == []


def test_the_kit_heavy_idea_and_room_checks_see_planted_offences(tmp_path: Path) -> None:
    """A demo importing the test kit, a lazy torch import in read/, a module without its idea and an agent
    room of eleven modules are each reported."""
    kit = tmp_path / "kit.py"
    kit.write_text("from .testing.otlp import OtlpGrpcReceiver\n")
    lazy = tmp_path / "lazy.py"
    lazy.write_text("def f():\n    import torch\n    from opentelemetry.sdk.trace import ReadableSpan\n")
    bare = tmp_path / "bare.py"
    bare.write_text('"""Helpers."""\nx = 1\n')
    said = tmp_path / "said.py"
    said.write_text('"""Why the store is trusted no further than the shape of the job."""\nx = 1\n')
    assert [u.split(" imports ")[1] for u in kit_imports({"fr_otel.demo": kit})] == [
        "fr_otel.testing.otlp ['OtlpGrpcReceiver']"]
    assert [h.split(" imports ")[1] for h in heavy_imports({"fr_otel.read.lazy": lazy})] == [
        "torch", "opentelemetry.sdk.trace"]
    assert unexplained_modules({"fr_otel.read.bare": bare, "fr_otel.read.said": said}) == ["fr_otel.read.bare"]
    room = {f"fr_otel.agent.links.m{i}": said for i in range(11)} | {"fr_otel.agent.links": said}
    assert crowded_rooms(room, MAX_AGENT_ROOM) == ["fr_otel.agent.links (11 modules)"]
    assert crowded_rooms({f"fr_otel.agent.links.m{i}": said for i in range(10)}, MAX_AGENT_ROOM) == []


@pytest.mark.parametrize("layer", [*LAYERS, "agent", *(f"agent/{room}" for room in ("guest", "observe", "serve",
                                                                                 "links", "incident"))])
def test_every_layer_package_says_what_it_is_for(layer: str) -> None:
    """Each layer folder, the agent and each of its rooms has an __init__ docstring (what a newcomer reads first)."""
    doc = ast.get_docstring(ast.parse((PACKAGE / layer / "__init__.py").read_text(encoding="utf-8")))
    assert doc and len(doc) > 40

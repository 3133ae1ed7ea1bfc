"""vastmgr's floors: every import points down. An app imports only apps on lower floors (never
one on its own floor, never one above), no module is part of an import circle, and nothing in
the product imports the roof (`devtools`). Every import counts: module-level, inside functions
and under TYPE_CHECKING."""

import ast
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import REPO

# Bottom up; README "How the code is laid out" draws the same floors.
FLOORS: list[tuple[str, ...]] = [
    ("vastmgr.lib",),
    ("vastmgr.fleet",),
    ("vastmgr.proofs",),
    ("vastmgr.instances",),
    ("vastmgr.remote",),
    ("vastmgr.autopilot",),
    ("vastmgr.front",),
    ("vastmgr.api", "vastmgr.metrics", "vastmgr.notify"),
    ("vastmgr.controller", "vastmgr.ops"),
    # The project's wiring: Django's settings, URLconf and ASGI entry points.
    ("vastmgr.settings", "vastmgr.urls", "vastmgr.routing", "vastmgr.asgi"),
]
ROOF = "devtools"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, wherever the import statement sits."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            # `from package import module` imports the module.
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def product_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((REPO / "vastmgr").rglob("*.py"))
            if "migrations" not in p.parts}


def graph() -> dict[str, set[str]]:
    modules = product_modules()
    return {name: {m for m in imports_of(path) if m in modules and m != name}
            for name, path in modules.items()}


def floor_of(module: str) -> tuple[int, str]:
    """The module's floor and its owner: its app, or the wiring (one unit: asgi imports the
    routing)."""
    for level, owners in enumerate(FLOORS):
        for owner in owners:
            if module == owner or module.startswith(owner + "."):
                return level, "wiring" if owners is FLOORS[-1] else owner
    raise AssertionError(f"{module} sits on no floor: add its package to FLOORS")


def test_every_module_sits_on_a_floor():
    for module in product_modules():
        if module != "vastmgr":
            floor_of(module)


def test_every_import_points_down():
    upward = []
    for module, imported in graph().items():
        if module == "vastmgr":
            continue
        level, app = floor_of(module)
        for target in imported:
            if target == "vastmgr":
                continue
            target_level, target_app = floor_of(target)
            if target_app != app and target_level >= level:
                upward.append(f"{module} -> {target}")
    assert not upward, "imports that do not point down:\n" + "\n".join(sorted(upward))


def test_no_module_is_part_of_an_import_circle():
    edges = graph()
    circles, state = [], defaultdict(int)  # 0 new, 1 on the path, 2 done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges[module]):
            if state[target] == 1:
                circles.append(" -> ".join(path[path.index(target):] + [module, target]))
            elif state[target] == 0:
                visit(target, path + [module])
        state[module] = 2

    for module in sorted(edges):
        if state[module] == 0:
            visit(module, [])
    assert not circles, "import circles:\n" + "\n".join(circles)


@pytest.mark.parametrize("module", sorted(product_modules()))
def test_the_product_never_imports_the_roof(module):
    imported = imports_of(product_modules()[module])
    assert not {m for m in imported if m == ROOF or m.startswith(ROOF + ".")}


def test_the_rules_would_catch_an_upward_import_and_a_circle(tmp_path, monkeypatch):
    """The checks above fail on the shapes they exist to forbid."""
    assert floor_of("vastmgr.fleet.models")[0] < floor_of("vastmgr.front.readmodel")[0]
    fake = {"vastmgr.fleet.models": {"vastmgr.front.readmodel"},
            "vastmgr.front.readmodel": {"vastmgr.fleet.models"}}
    monkeypatch.setattr(__import__(__name__, fromlist=["graph"]), "graph", lambda: fake)
    with pytest.raises(AssertionError, match="do not point down"):
        test_every_import_points_down()
    with pytest.raises(AssertionError, match="import circles"):
        test_no_module_is_part_of_an_import_circle()

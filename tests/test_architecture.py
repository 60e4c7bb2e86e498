"""The shape of the package, as docs/architecture.md states it: modules
import downwards through the layers, never in a cycle, and the page names
every module."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "numbagraph"

# Lowest first; a module may import from its own layer or a lower one.
LAYERS = [
    ("errors", "backend"),
    ("_registry", "_graphmem", "_hostcalls", "_forks", "_foreign"),
    ("safety",),
    ("_patches", "graph", "_rebind", "nodes"),
    ("capture",),
    ("scalar", "conditional", "_unroll", "alloc", "host", "fork", "devnodes", "_resize",
     "_reached"),
    ("ops", "precompile", "graphed", "loops", "launch", "dist"),
    ("bench", "soak", "__init__"),
]


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _resolve(module: str, path: pathlib.Path, node: ast.ImportFrom) -> list[str]:
    """The numbagraph modules an import statement imports."""
    if node.level:
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for _ in range(node.level - 1):
            package = package.rsplit(".", 1)[0]
        base = f"{package}.{node.module}" if node.module else package
    else:
        base = node.module or ""
    if not base.startswith("numbagraph"):
        return []
    found = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        found.append(sub if sub in MODULES else base)
    return found


def _imports() -> dict[str, set[str]]:
    graph = {}
    for module, path in MODULES.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                targets.update(_resolve(module, path, node))
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name.startswith("numbagraph"))
        graph[module] = {t for t in targets if t != module and t in MODULES}
    return graph


def _layer(module: str) -> int:
    rest = module.split(".")[1:] or ["__init__"]
    for index, names in enumerate(LAYERS):
        if rest[0] in names:
            return index
    raise AssertionError(f"{module} belongs to no layer: add it to LAYERS and the docs")


def test_the_package_has_no_import_cycle():
    graph = _imports()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycle = stack[stack.index(target):] + [target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_modules_import_only_their_own_layer_or_lower():
    upward = [
        f"{module} (layer {_layer(module)}) imports {target} (layer {_layer(target)})"
        for module, targets in _imports().items()
        for target in targets
        if _layer(target) > _layer(module)
    ]
    assert not upward, "\n".join(upward)


def test_only_the_backend_package_names_a_backend_module():
    named = [
        f"{module} imports {target}"
        for module, targets in _imports().items()
        if not module.startswith("numbagraph.backend")
        for target in targets
        if target.startswith("numbagraph.backend.")
        and target != "numbagraph.backend.interface"
    ]
    assert not named, "\n".join(named)


def test_architecture_page_names_every_module():
    page = (ROOT / "docs" / "architecture.md").read_text()
    missing = [
        module for module in MODULES
        if module != "numbagraph"
        and not module.startswith("numbagraph.bench.")
        and f"`{module.split('.', 1)[1].replace('.', '/')}" not in page
    ]
    assert not missing, f"docs/architecture.md does not name {missing}"

"""The layering of the tree: client -> ragkv -> workers -> kvstore, no import circles, small modules.

Every import in every project module counts, function-level (lazy) ones included; only imports under
`if TYPE_CHECKING:` are left out (they never run). A package's own `__init__` importing its modules,
or a module importing its own package, is not an edge between two modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"kvstore": 0, "workers": 1, "ragkv": 2, "client": 3}  # a module imports its own layer or lower ones
MAY_IMPORT_UP = {("ragkv.commands", "client"), ("ragkv.bench", "client")}  # the CLI and the benches use the SDK
GENERATED = ("ragkv.v1",)  # protoc output
MAX_LINES = 450


def _modules() -> dict[str, Path]:
    mods = {}
    for package in LAYERS:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST):
    """Every Import/ImportFrom, at any depth, except inside `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        children = list(ast.iter_child_nodes(node))
        if isinstance(node, ast.If) and _is_type_checking(node):
            children = node.orelse
        stack.extend(children)


def _project_module(name: str) -> str | None:
    """The project module that `name` (a dotted import target) lives in, or None (third-party)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> set[str]:
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in _import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import mod` imports the module pkg.mod; `from mod import name` imports mod
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for target in targets:
            resolved = _project_module(target)
            if resolved and resolved != module and not _own_package(module, resolved):
                found.add(resolved)
    return found


def _own_package(a: str, b: str) -> bool:
    """True when one is a package containing the other (its __init__ does not count as a separate module)."""
    return a.startswith(b + ".") or b.startswith(a + ".")


GRAPH = {m: _imports(m) for m in MODULES if not m.startswith(GENERATED)}


def _layer(module: str) -> int:
    return LAYERS[module.split(".")[0]]


def test_the_walk_sees_real_edges():
    """The walk is not vacuous: known edges, lazy ones included, are found."""
    assert "kvstore.store" in GRAPH["workers.engine"]
    assert "workers.engine" in GRAPH["ragkv.server.app"] or "workers.ray_pool" in GRAPH["ragkv.server.app"]
    assert len(GRAPH) > 80


def test_no_module_imports_a_higher_layer():
    bad = [f"{m} -> {o}" for m, out in GRAPH.items() for o in sorted(out)
           if _layer(o) > _layer(m) and not any(m.startswith(src) and o.startswith(dst) for src, dst in MAY_IMPORT_UP)]
    assert not bad, "imports that point up a layer:\n" + "\n".join(sorted(bad))


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycles():
    cycle = _find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_cycle_finder_finds_one():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_hand_written_modules_stay_small():
    sizes = {m: len(MODULES[m].read_text().splitlines()) for m in GRAPH}
    big = [f"{m}: {n} lines" for m, n in sorted(sizes.items()) if n > MAX_LINES]
    assert not big, f"over {MAX_LINES} lines (probably two things in one file):\n" + "\n".join(big)

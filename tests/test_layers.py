"""The package's layers point one way: schemas <- actors <- engine <- strategies <- jobs, no cycles.

Walks every import statement (module level and inside functions) of the five packages with ``ast``.
"""

import ast
from pathlib import Path

from tests.conftest import REPO

LAYERS = ["schemas", "actors", "engine", "strategies", "jobs"]


def modules() -> dict[str, Path]:
    found = {}
    for package in LAYERS:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: Path, name: str, known: set[str]) -> set[str]:
    """Our modules that ``path`` imports (``from a import b`` counts a.b when that is a module)."""
    out = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


GRAPH = {name: imports(path, name, set(modules())) for name, path in modules().items()}


def test_layers_point_one_way():
    upward = [(m, t) for m, targets in GRAPH.items() for t in targets
              if LAYERS.index(t.split(".")[0]) > LAYERS.index(m.split(".")[0])]
    assert upward == []


def test_no_import_cycles():
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
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
                cycles.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert cycles == []


def test_strategies_stay_pure():
    """No Ray, no files, no network inside a strategy: the engine does the I/O."""
    forbidden = {"ray", "pyarrow", "os", "pathlib", "socket", "subprocess", "requests", "urllib"}
    found = []
    for path in (REPO / "strategies").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [(path.name, n) for n in names if n.split(".")[0] in forbidden]
    assert found == []

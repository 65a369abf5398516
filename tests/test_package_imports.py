"""The package's modules import one another in one direction only: a circle (a imports b, which imports a, at the top
or inside a function) means two modules share one job, and it breaks as soon as either import moves to the top."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "corevision_hf"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that the file at `path` imports anywhere in it (relative or absolute)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            found |= {target} | {f"{target}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return (found & modules) - {name}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The modules that reach one another through imports, each group sorted (Tarjan's strongly connected parts)."""
    order, low, stack, found = {}, {}, [], []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for other in graph[module]:
            if other not in order:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], order[other])
        if low[module] == order[module]:
            part = stack[stack.index(module):]
            del stack[stack.index(module):]
            if len(part) > 1:
                found.append(sorted(part))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return found


def test_no_two_modules_of_the_package_import_each_other():
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {name: imported_modules(path, set(paths)) for name, path in paths.items()}
    assert circles(graph) == []


def test_a_circle_is_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]

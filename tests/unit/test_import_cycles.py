"""No import cycle anywhere in the project's packages (issue 32): the graph of module-level imports, those under
``if TYPE_CHECKING:`` included (a cycle closed only for the type checker is still a knot a reader must untie),
function-local imports left out (they are the daemon's way to keep torch out of its process)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("arceus", "arceusd", "protocol", "partitioner")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top_level_imports(tree: ast.Module, me: str, is_package: bool, modules: frozenset[str] = frozenset()) -> set[str]:
    """Modules imported at module level or under ``if`` (``TYPE_CHECKING``), never inside a function or class.
    ``from p import m`` where ``p.m`` is one of ``modules`` imports ``p.m``, not the package ``p``."""
    found: set[str] = set()
    body = list(tree.body)
    while body:
        node = body.pop()
        if isinstance(node, ast.If):
            body += node.body + node.orelse
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = me.split(".") if is_package else me.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            named = {f"{base}.{alias.name}" for alias in node.names}
            found |= named if named <= modules else {base} | named
    return found


def graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    modules = {module_name(p): p for p in files}
    edges: dict[str, set[str]] = {}
    names = frozenset(modules)
    for name, path in modules.items():
        imported = top_level_imports(ast.parse(path.read_text()), name, path.name == "__init__.py", names)
        edges[name] = {m for m in imported if m in modules and m != name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_the_cycle_finder_finds_a_cycle_closed_under_type_checking() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.b import B\n")
    assert top_level_imports(tree, "p.a", False) == {"typing", "typing.TYPE_CHECKING", "p.b", "p.b.B"}
    local = ast.parse("def f():\n    import p.b\n")
    assert top_level_imports(local, "p.a", False) == set(), "a function-local import is not an edge"
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_in_the_project() -> None:
    edges = graph()
    assert len(edges) > 200, "the graph did not find the project's modules"
    found = cycles(edges)
    assert found == [], "import cycles (module level and TYPE_CHECKING): " + "; ".join(" -> ".join(c) for c in found)

"""Print launcher's module import graph: one ``importer -> imported`` edge per line, then
counts and the largest modules.

Usage: ``python scripts/import_graph.py [--units] [ROOT]`` (ROOT: a checkout, default the
current directory). Without ``--units`` every module is a node; with it each subpackage
(``launcher.sim``, ``launcher.sglang``, ``launcher.host.transport``) is one node, as the layer map
in docs/architecture.md draws them. Imports inside ``if TYPE_CHECKING:`` count too (they are
still a dependency of the code). Also prints the import loops (strongly connected components).
Reads the source only (ast); imports nothing from launcher.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, name: str, modules: set[str]) -> set[str]:
    """The launcher modules ``path`` (module ``name``) imports."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            # "from launcher import remote" imports the module launcher.host.run
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for t in targets:
            while t and t not in modules:
                t = t.rpartition(".")[0]
            if t and t != name and t.startswith("launcher"):
                found.add(t)
    return found


def graph(root: Path) -> dict[str, set[str]]:
    files = sorted((root / "launcher").rglob("*.py"))
    names = {module_name(root, f): f for f in files}
    modules = set(names)
    edges = {n: imports_of(f, n, modules) for n, f in names.items()}
    # "from launcher.x import y" also names the package launcher.x's __init__ when x is a
    # package; a bare package with an empty __init__ is not a dependency worth counting.
    for n in edges:
        edges[n].discard("launcher")
    return edges


def units(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """Collapse every subpackage of launcher into one node."""

    def unit(m: str) -> str:
        return ".".join(m.split(".")[:2])

    out: dict[str, set[str]] = {}
    for src, dsts in edges.items():
        node = out.setdefault(unit(src), set())
        node.update(unit(d) for d in dsts if unit(d) != unit(src))
    return out


def loops(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--units"]
    root = Path(args[0] if args else ".").resolve()
    edges = graph(root)
    if "--units" in sys.argv[1:]:
        edges = units(edges)
    for src in sorted(edges):
        for dst in sorted(edges[src]):
            print(f"{src} -> {dst}")
    n_edges = sum(len(v) for v in edges.values())
    print(f"# {len(edges)} nodes, {n_edges} edges")
    for comp in loops(edges):
        print("# loop: " + " <-> ".join(comp))
    sizes = sorted(
        ((len(p.read_text().splitlines()), module_name(root, p))
         for p in (root / "launcher").rglob("*.py")),
        reverse=True,
    )
    print("# largest: " + ", ".join(f"{m} {n}" for n, m in sizes[:8]))


if __name__ == "__main__":
    main()

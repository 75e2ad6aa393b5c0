"""The layering rules of docs/architecture.md, checked on the source (ast, no imports).

``LAYERS`` lists the layers of ``launcher/`` from the bottom up; a layer is the modules and
folders named in its row (a folder covers every module under it, so a new module in a layer
folder needs no edit here). On every module of ``launcher/``, module-level and function-level
imports alike (``if TYPE_CHECKING:`` ones too: they are still a dependency):

- every module sits in a layer, and at most 6 modules sit directly in ``launcher/``;
- imports go only downward or within a layer (``sim`` is on top: nothing imports it);
- no import loop between modules;
- no module imports another module's ``_private`` name (``from m import _x`` or ``m._x``);
- no re-export shim: every name a module imports from ``launcher`` is used there, and none is
  written ``x as x``. A name lives in one module and its users import it from there.

These rules apply to ``launcher/``; tests may reach the privates of the module they test.
Each rule's checker is a function of source strings, shown failing on a planted example.

Besides: ``launcher/sglang/`` is pure knowledge (it imports only itself, the pure domain types
and a few pure stdlib modules), and the default SGLang version is written once, in
``launcher/sglang/versions.py``.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from launcher.sglang.versions import DEFAULT_VERSION, SUPPORTED_VERSIONS, version_tuple

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "launcher"
SIM = PACKAGE / "sim"
SGLANG = PACKAGE / "sglang"

# The layers, bottom up: a module may import from its own layer and the layers before it.
# An entry names a module or a folder (which covers every module under it).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("leaf", ("launcher.errors", "launcher.params", "launcher.durations", "launcher.untrusted")),
    ("sglang", ("launcher.sglang",)),
    ("memory", ("launcher.memory",)),
    ("config", ("launcher.config",)),
    ("store", ("launcher.store",)),
    ("host", ("launcher.host",)),
    ("plan", ("launcher.plan",)),
    ("supervise", ("launcher.supervise",)),
    ("hooks", ("launcher.hooks",)),
    ("daemon", ("launcher.daemon",)),
    ("cli", ("launcher.cli",)),
    # The simulated SGLang host: on top, so that nothing may import it.
    ("sim", ("launcher.sim",)),
]
# The package itself: its __init__ holds only __version__, which any layer may read.
TOP = "launcher"
MAX_TOP_LEVEL_MODULES = 6

# What launcher/sglang may import besides itself: no I/O, no third-party code.
PURE_STDLIB = {
    "__future__", "codecs", "collections", "dataclasses", "datetime", "enum", "itertools", "json",
    "math", "re", "shlex", "typing",
}
# The pure domain types launcher/sglang may use besides itself (no I/O either).
DOMAIN = {"launcher.params", "launcher.durations", "launcher.errors", "launcher.untrusted"}


def _modules(under: Path) -> list[Path]:
    return sorted(under.rglob("*.py"))


def _name(path: Path) -> str:
    """The module name of ``path``; a package's ``__init__.py`` is the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def sources() -> dict[str, str]:
    """Every module of launcher/, by module name (read once; treat as read-only)."""
    return {_name(p): p.read_text() for p in _modules(PACKAGE)}


# --- the checkers: functions of {module name: source} -----------------------------------------


@dataclass(frozen=True)
class Import:
    """One name an import binds in a module."""

    line: int
    module: str  # the module imported, or imported from (a submodule when one is named)
    name: str | None  # the name taken from ``module``; None when the import binds the module
    bound: str  # the local name it binds
    self_alias: bool  # spelled ``name as name`` (the re-export idiom)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _resolve(dotted: str, known: Iterable[str]) -> str:
    """The longest known module ``dotted`` starts with (``dotted`` itself if none)."""
    found = dotted
    while found and found not in known:
        found = found.rpartition(".")[0]
    return found or dotted


def imports(source: str, module: str, known: Iterable[str]) -> list[Import]:
    """Every import in ``source`` (module ``module``; ``known``: the module names), at any
    depth. ``from pkg import name`` imports the module ``pkg.name`` when that is known."""
    known = set(known)
    is_package = any(k.startswith(module + ".") for k in known)
    package = module if is_package else module.rpartition(".")[0]
    out: list[Import] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for a in node.names:
                out.append(Import(node.lineno, a.name, None, a.asname or a.name.split(".")[0],
                                  a.asname == a.name))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base]) if base else ".".join(parts)
            for a in node.names:
                bound = a.asname or a.name
                sub = f"{base}.{a.name}"
                if sub in known:
                    out.append(Import(node.lineno, sub, None, bound, a.asname == a.name))
                else:
                    out.append(Import(node.lineno, _resolve(base, known), a.name, bound,
                                      a.asname == a.name))
    return out


def _internal(source: str, module: str, known: Iterable[str]) -> list[Import]:
    return [i for i in imports(source, module, known) if i.module.split(".")[0] == TOP]


def layer_of(module: str) -> int | None:
    """The index in ``LAYERS`` of ``module``'s layer; None when no row names it."""
    if module == TOP:
        return 0
    best: tuple[int, int] | None = None  # (length of the entry, layer)
    for index, (_, entries) in enumerate(LAYERS):
        for entry in entries:
            if (module == entry or module.startswith(entry + ".")) and (
                best is None or len(entry) > best[0]
            ):
                best = (len(entry), index)
    return None if best is None else best[1]


def unplaced(modules: Iterable[str]) -> list[str]:
    """Modules in no layer of ``LAYERS``."""
    return [m for m in modules if layer_of(m) is None]


def top_level_modules(modules: Collection[str]) -> list[str]:
    """The modules directly in ``launcher/`` (its ``__init__`` included)."""
    return sorted(m for m in modules if m.count(".") <= 1 and m.split(".")[0] == TOP
                  and not any(k.startswith(m + ".") for k in modules if m != TOP))


def upward_imports(code: Mapping[str, str]) -> list[str]:
    """Imports from a higher layer, as 'module:line imports target (layer -> layer)'."""
    out = []
    for module, source in code.items():
        mine = layer_of(module)
        for i in _internal(source, module, code):
            theirs = layer_of(i.module)
            if mine is not None and theirs is not None and theirs > mine:
                out.append(f"{module}:{i.line} imports {i.module} "
                           f"({LAYERS[mine][0]} -> {LAYERS[theirs][0]})")
    return out


def import_graph(code: Mapping[str, str]) -> dict[str, set[str]]:
    """Module -> the other modules of ``code`` it imports."""
    return {
        module: {i.module for i in _internal(source, module, code)
                 if i.module != module and i.module in code}
        for module, source in code.items()
    }


def import_loops(code: Mapping[str, str]) -> list[list[str]]:
    """The import loops: strongly connected components of more than one module (Tarjan)."""
    edges = import_graph(code)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
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
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def _dotted(node: ast.expr) -> list[str] | None:
    """``a.b.c`` as ['a', 'b', 'c']; None for anything but names and attributes."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute) and (head := _dotted(node.value)) is not None:
        return [*head, node.attr]
    return None


def private_imports(code: Mapping[str, str]) -> list[str]:
    """Uses of another module's ``_private`` name: ``from m import _x``, and ``m._x`` where
    ``m`` is a module bound by an import; as 'module:line: m._x'."""
    out = []
    for module, source in code.items():
        found = _internal(source, module, code)
        out += [f"{module}:{i.line}: {i.module}.{i.name}" for i in found
                if i.name is not None and _is_private(i.name) and i.module != module]
        # A name bound to a module: ``import a.b`` binds ``a`` to a; ``import a.b as m`` and
        # ``from a import b`` (b a module) bind to a.b.
        modules = {
            i.bound: (i.module if i.bound != i.module.split(".")[0] else i.bound)
            for i in found if i.name is None
        }
        attributes = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Attribute)]
        for node in sorted(attributes, key=lambda n: n.lineno):
            if not _is_private(node.attr):
                continue
            path = _dotted(node.value)
            if path is None or path[0] not in modules:
                continue
            target = _resolve(".".join([modules[path[0]], *path[1:]]), code)
            if target in code and target != module:
                out.append(f"{module}:{node.lineno}: {target}.{node.attr}")
    return out


def _exported(tree: ast.Module) -> set[str]:
    """The names in a module's ``__all__`` (a literal list or tuple of strings)."""
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                 for t in node.targets)
                and isinstance(node.value, ast.List | ast.Tuple)):
            return {e.value for e in node.value.elts
                    if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def reexports(code: Mapping[str, str]) -> list[str]:
    """Re-export shims: a name imported from another launcher module and written ``x as x``,
    listed in ``__all__``, or never read in the module (so it is only there for others to
    import); as 'module:line: target.name'."""
    out = []
    for module, source in code.items():
        tree = ast.parse(source)
        read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
                and isinstance(n.ctx, ast.Load)}
        exported = _exported(tree)
        for i in _internal(source, module, code):
            if i.self_alias or i.bound in exported or i.bound not in read:
                what = i.module if i.name is None else f"{i.module}.{i.name}"
                out.append(f"{module}:{i.line}: {what}")
    return out


# --- the rules on launcher/ -------------------------------------------------------------------


def test_every_module_sits_in_a_layer() -> None:
    """Each module of launcher/ is named by a row of LAYERS (a new folder needs a row)."""
    assert [] == unplaced(sources())


def test_the_layer_table_places_a_new_module_by_its_folder() -> None:
    """A module added to a layer folder is in that layer; a new top-level module is in none."""
    assert layer_of("launcher.memory.estimate") == layer_of("launcher.memory.policy")
    assert ["launcher.extra"] == unplaced(["launcher.extra", "launcher.memory.estimate"])


def test_at_most_six_modules_sit_directly_in_the_package() -> None:
    """Everything but the leaf types, the daemon and __init__ lives in a layer folder."""
    found = top_level_modules(sources())
    assert len(found) <= MAX_TOP_LEVEL_MODULES, found


def test_the_module_counter_sees_a_seventh_top_level_module() -> None:
    """The counter counts modules directly in launcher/, not packages or their modules."""
    planted = ["launcher", "launcher.a", "launcher.b", "launcher.c", "launcher.d", "launcher.e",
               "launcher.f", "launcher.host", "launcher.host.run", "launcher.host.transport.ssh"]
    assert len(top_level_modules(planted)) == 7


def test_imports_only_go_down_the_layers() -> None:
    """No module imports from a layer above its own."""
    assert [] == upward_imports(sources())


def test_the_upward_checker_sees_an_upward_import() -> None:
    """An import from a higher layer fails, at any depth and in any spelling; downward,
    same-layer and ``__version__`` imports pass."""
    planted = {
        "launcher.supervise.router": (
            "from launcher.hooks.logging import level_of\n"
            "from launcher.supervise import events\n"
            "from launcher import __version__\n"
            "def f():\n"
            "    import launcher.hooks.slack\n"
        ),
        "launcher.hooks.logging": "from launcher.supervise.events import Event\n",
        "launcher.hooks.slack": "",
        "launcher.supervise.events": "from launcher.sim import server\n",
        "launcher.sim.server": "",
        "launcher": "",
    }
    assert [
        "launcher.supervise.router:1 imports launcher.hooks.logging (supervise -> hooks)",
        "launcher.supervise.router:5 imports launcher.hooks.slack (supervise -> hooks)",
        "launcher.supervise.events:1 imports launcher.sim.server (supervise -> sim)",
    ] == upward_imports(planted)


def test_there_is_no_import_loop() -> None:
    """No two modules import each other, directly or around a circle."""
    assert [] == import_loops(sources())


def test_the_loop_checker_sees_a_loop_through_a_function_level_import() -> None:
    """A loop closed by an import inside a function is still a loop."""
    planted = {
        "launcher.config.schema": "from launcher.config.sources import load\n",
        "launcher.config.sources": "from launcher.config import problems\n",
        "launcher.config.problems": "def f():\n    from launcher.config.schema import Config\n",
        "launcher.config.placeholders": "from launcher.config import schema\n",
    }
    assert [["launcher.config.problems", "launcher.config.schema",
             "launcher.config.sources"]] == import_loops(planted)


def test_no_module_uses_another_modules_private_names() -> None:
    """A name another module needs is public and documented, or moves to its user."""
    assert [] == private_imports(sources())


def test_the_private_checker_sees_every_spelling() -> None:
    """``from m import _x``, ``m._x`` through ``import``/``from``/``as`` fail; a module's own
    privates, dunders and attributes of non-modules pass."""
    planted = {
        "launcher.host.run": (
            "from launcher.host.shell import _quote, quote\n"
            "import launcher.host.shell\n"
            "import launcher.host.shell as sh\n"
            "from launcher.host import shell\n"
            "from launcher import __version__\n"
            "def f(x):\n"
            "    launcher.host.shell._a()\n"
            "    sh._b\n"
            "    shell._c\n"
            "    quote._d\n"
            "    x._e\n"
            "    return _own()\n"
            "def _own(): ...\n"
        ),
        "launcher.host.shell": "def _quote(): ...\ndef quote(): ...\n",
        "launcher.host": "",
        "launcher": "",
    }
    assert [
        "launcher.host.run:1: launcher.host.shell._quote",
        "launcher.host.run:7: launcher.host.shell._a",
        "launcher.host.run:8: launcher.host.shell._b",
        "launcher.host.run:9: launcher.host.shell._c",
    ] == private_imports(planted)


def test_there_is_no_re_export_shim() -> None:
    """Every launcher name a module imports, it uses; nothing is written ``x as x``."""
    assert [] == reexports(sources())


def test_the_re_export_checker_sees_a_shim() -> None:
    """``x as x`` fails even when used; an imported name listed in ``__all__`` (read or not)
    or never read fails; names read in code, annotations or as a module's attribute pass."""
    planted = {
        "launcher.host.run": (
            "from launcher.host.preflight import port_in_use as port_in_use\n"
            "from launcher.host.preflight import path_exists\n"
            "from launcher.host.preflight import PORT, Problem, check\n"
            "from launcher.host import shell\n"
            "__all__ = ['path_exists', 'check', 'run']\n"
            "def f(p: Problem) -> None:\n"
            "    check(port_in_use, shell.quote, path_exists)\n"
            "def run(): ...\n"
        ),
        "launcher.host.preflight": "",
        "launcher.host.shell": "",
        "launcher.host": "",
    }
    assert [
        "launcher.host.run:1: launcher.host.preflight.port_in_use",
        "launcher.host.run:2: launcher.host.preflight.path_exists",
        "launcher.host.run:3: launcher.host.preflight.PORT",
        "launcher.host.run:3: launcher.host.preflight.check",
    ] == reexports(planted)


# --- the simulator, the sglang package, the default version -----------------------------------


def sim_imports(source: str, module: str) -> list[str]:
    """Imports of launcher.sim (any of its modules) in ``source``, as 'line: name'."""
    return [
        f"{i.line}: {i.module if i.name is None else f'{i.module}.{i.name}'}"
        for i in imports(source, module, ())
        if i.module == "launcher.sim" or i.module.startswith("launcher.sim.")
        or (i.module == "launcher" and i.name == "sim")
    ]


def test_the_checker_sees_every_spelling_of_a_sim_import() -> None:
    """Absolute, from-, package-relative and relative imports of the simulator are found."""
    src = (
        "import launcher.sim.memory\n"
        "from launcher.sim.memory import simulate\n"
        "from launcher import sim\n"
        "from .sim import observe\n"
        "from launcher import simple\n"  # not the simulator
    )
    assert ["1: launcher.sim.memory", "2: launcher.sim.memory.simulate", "3: launcher.sim",
            "4: launcher.sim.observe"] == sim_imports(src, "launcher.daemon")


@pytest.mark.parametrize(
    "path", [p for p in _modules(PACKAGE) if SIM not in p.parents], ids=_name
)
def test_nothing_outside_the_simulator_imports_it(path: Path) -> None:
    """Production code must not depend on the thing that imitates SGLang."""
    assert [] == sim_imports(path.read_text(), _name(path)), (
        f"{path.relative_to(ROOT)} imports the simulator; move what it needs to "
        "launcher/sglang/ (SGLang knowledge) or a domain module"
    )


@pytest.mark.parametrize("path", _modules(SGLANG), ids=_name)
def test_the_sglang_package_is_pure(path: Path) -> None:
    """launcher/sglang imports only itself, the pure domain types and pure stdlib modules."""
    foreign = [
        f"{i.line}: {i.module}"
        for i in imports(path.read_text(), _name(path), sources())
        if not (i.module == "launcher.sglang" or i.module.startswith("launcher.sglang."))
        and i.module.split(".")[0] not in PURE_STDLIB
        and i.module not in DOMAIN
    ]
    assert [] == foreign


def default_version_literals(source: str) -> list[int]:
    """Lines where ``source`` writes the default version as a string of its own."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and node.value == DEFAULT_VERSION
    ]


def test_the_default_version_is_written_once() -> None:
    """A new SGLang version is one edit, in launcher/sglang/versions.py."""
    found = {
        str(p.relative_to(ROOT)): lines
        for p in _modules(PACKAGE)
        if (lines := default_version_literals(p.read_text()))
    }
    assert ["launcher/sglang/versions.py"] == list(found), found
    assert 1 == len(found["launcher/sglang/versions.py"])


def test_the_default_version_is_the_newest_supported() -> None:
    """The default is the last of the supported versions, which are in order."""
    assert sorted(SUPPORTED_VERSIONS, key=version_tuple) == list(SUPPORTED_VERSIONS)
    assert DEFAULT_VERSION == SUPPORTED_VERSIONS[-1]


# --- a lost lease is never taken for a failure ------------------------------------------------

# Where host actions are caught and judged (a failed launch, a failed probe, a retry): a
# LeaseLost there must pass through untouched (docs/ha.md, "A lost lease inside a supervisor").
LEASE_CHECKED = ("launcher.supervise.", "launcher.daemon", "launcher.host.", "launcher.plan.")
# What a handler catches that would catch LeaseLost too. LauncherError does not: LeaseLost is
# its sibling (launcher/errors.py), so only handlers this broad need a re-raise. An exception
# group may hold a LeaseLost a task group wrapped.
_BROAD = {"LauncherException", "Exception", "BaseException", "ExceptionGroup",
          "BaseExceptionGroup"}


def _tuples(tree: ast.Module) -> dict[str, list[ast.expr]]:
    """Module-level ``NAME = (A, B, ...)``: exception tuples a handler may name."""
    out = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Tuple)):
            out[node.targets[0].id] = list(node.value.elts)
    return out


def _caught(handler: ast.ExceptHandler,
            tuples: Mapping[str, list[ast.expr]] | None = None) -> set[str]:
    """The last names of the exception types ``handler`` catches ("BaseException" when bare),
    a module-level tuple named in it expanded."""
    if handler.type is None:
        return {"BaseException"}
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    names = set()
    for t in types:
        name = (_dotted(t) or ["?"])[-1]
        expanded = (tuples or {}).get(name) if isinstance(t, ast.Name) else None
        names |= ({(_dotted(e) or ["?"])[-1] for e in expanded} if expanded is not None
                  else {name})
    return names


def _reraises(handler: ast.ExceptHandler) -> bool:
    """A handler that ends in a bare ``raise`` (cleanup, then the same exception), or whose
    first statement is ``reraise_lease_lost(...)`` (a broad catch that may hold a task
    group's exception group)."""
    last = handler.body[-1]
    if isinstance(last, ast.Raise) and last.exc is None:
        return True
    first = handler.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Call):
        return (_dotted(first.value.func) or ["?"])[-1] == "reraise_lease_lost"
    return False


def _awaits(body: list[ast.stmt]) -> bool:
    return any(isinstance(n, ast.Await | ast.AsyncFor | ast.AsyncWith)
               for stmt in body for n in ast.walk(stmt))


def lease_swallowers(code: Mapping[str, str]) -> list[str]:
    """``module:line`` of each handler in LEASE_CHECKED that catches LeaseLost (LauncherException,
    Exception, bare) without a ``except LeaseLost: raise`` before it in the same ``try``,
    unless it calls ``reraise_lease_lost`` first or ends in a bare ``raise``."""
    found = []
    for module, source in code.items():
        if not module.startswith(LEASE_CHECKED):
            continue
        tree = ast.parse(source)
        tuples = _tuples(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Try | ast.TryStar) or not _awaits(node.body):
                continue  # a host action is awaited: a try without an await makes none
            passed = False
            for handler in node.handlers:
                caught = _caught(handler, tuples)
                if "LeaseLost" in caught or "FencedOut" in caught:
                    body = handler.body
                    passed = passed or (len(body) == 1 and isinstance(body[0], ast.Raise)
                                        and body[0].exc is None and "LeaseLost" in caught)
                    continue
                if caught & _BROAD and not passed and not _reraises(handler):
                    found.append(f"{module}:{handler.lineno}")
    return sorted(found)


def test_supervision_never_catches_a_lost_lease_as_a_failure() -> None:
    """Every broad handler in supervision re-raises LeaseLost first."""
    assert [] == lease_swallowers(sources())


def test_the_lease_checker_sees_a_swallowed_lease() -> None:
    """The checker flags a broad handler without the re-raise, and accepts both forms."""
    bad = "try:\n    await f()\nexcept Exception:\n    pass\n"
    good = ("try:\n    await f()\nexcept LeaseLost:\n    raise\n"
            "except Exception:\n    pass\n"
            "try:\n    await f()\nexcept LauncherError:\n    pass\n"  # LeaseLost is no failure
            "try:\n    await g()\nexcept Exception as exc:\n    reraise_lease_lost(exc)\n"
            "try:\n    f()\nexcept Exception:\n    pass\n")  # no await: no host action
    assert ["launcher.supervise.x:3"] == lease_swallowers({"launcher.supervise.x": bad})
    assert [] == lease_swallowers({"launcher.supervise.x": good})
    assert [] == lease_swallowers({"launcher.hooks.slack": bad})  # not a host-action layer
    named = "E = (OSError, ExceptionGroup)\ntry:\n    await f()\nexcept E:\n    pass\n"
    assert ["launcher.supervise.x:4"] == lease_swallowers({"launcher.supervise.x": named})


def test_a_lost_lease_is_not_a_failure() -> None:
    """The checker's premise: ``except LauncherError`` (a failed host action) never catches
    LeaseLost, while the CLI's catch of the root still does (exit 6)."""
    from launcher.errors import FencedOut, LauncherError, LauncherException, LeaseLost

    assert not issubclass(LeaseLost, LauncherError)
    assert issubclass(FencedOut, LeaseLost) and issubclass(LeaseLost, LauncherException)

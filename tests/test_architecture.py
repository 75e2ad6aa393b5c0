"""The layering rules of docs/architecture.md, checked on the source (ast, no imports).

- Nothing outside ``launcher/sim/`` imports the simulator: production code must not depend on
  the thing that imitates SGLang.
- ``launcher/sglang/`` is pure knowledge: it imports only itself, the pure domain types
  (``params``, ``durations``, ``errors``) and a few pure stdlib modules.
- The default SGLang version is written once, in ``launcher/sglang/versions.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from launcher.sglang.versions import DEFAULT_VERSION, SUPPORTED_VERSIONS, version_tuple

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "launcher"
SIM = PACKAGE / "sim"
SGLANG = PACKAGE / "sglang"
# What launcher/sglang may import besides itself: no I/O, no third-party code.
PURE_STDLIB = {
    "__future__", "codecs", "collections", "dataclasses", "datetime", "enum", "json", "math", "re",
    "typing",
}
# The pure domain types launcher/sglang may use besides itself (no I/O either).
DOMAIN = {"launcher.params", "launcher.durations", "launcher.errors", "launcher.untrusted"}


def _modules(under: Path) -> list[Path]:
    return sorted(under.rglob("*.py"))


def imported_modules(source: str, module: str) -> list[tuple[int, str]]:
    """(line, absolute module name) for every import in ``source`` of module ``module``;
    ``from pkg import name`` yields ``pkg.name`` (it may be a submodule)."""
    package = module.rpartition(".")[0]
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base]) if base else ".".join(parts)
            out += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return out


def _name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def sim_imports(source: str, module: str) -> list[str]:
    """Imports of launcher.sim (any of its modules) in ``source``, as 'line: name'."""
    return [
        f"{line}: {name}"
        for line, name in imported_modules(source, module)
        if name == "launcher.sim" or name.startswith("launcher.sim.")
    ]


def test_the_checker_sees_every_spelling_of_a_sim_import() -> None:
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
    assert [] == sim_imports(path.read_text(), _name(path)), (
        f"{path.relative_to(ROOT)} imports the simulator; move what it needs to "
        "launcher/sglang/ (SGLang knowledge) or a domain module"
    )


@pytest.mark.parametrize("path", _modules(SGLANG), ids=_name)
def test_the_sglang_package_is_pure(path: Path) -> None:
    foreign = [
        f"{line}: {name}"
        for line, name in imported_modules(path.read_text(), _name(path))
        if not name.startswith("launcher.sglang.")
        and name.split(".")[0] not in PURE_STDLIB
        and name.rpartition(".")[0] not in DOMAIN
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
    found = {
        str(p.relative_to(ROOT)): lines
        for p in _modules(PACKAGE)
        if (lines := default_version_literals(p.read_text()))
    }
    assert ["launcher/sglang/versions.py"] == list(found), found
    assert 1 == len(found["launcher/sglang/versions.py"])


def test_the_default_version_is_the_newest_supported() -> None:
    assert sorted(SUPPORTED_VERSIONS, key=version_tuple) == list(SUPPORTED_VERSIONS)
    assert DEFAULT_VERSION == SUPPORTED_VERSIONS[-1]

"""Move launcher's modules into their layer folders and rewrite every reference to them.

Usage::

    python scripts/relayer.py [--upto LAYER] [--no-move] [PATH ...]

PATH: files or folders to rewrite (default: launcher/, tests/, scripts/, configs/, systemd/,
docs/, README.md, pyproject.toml). ``--upto LAYER`` applies only the moves of the layers up to
and including LAYER (the layers are ``LAYER_ORDER``, bottom-up); ``--no-move`` rewrites
references only. The script is idempotent: a file already moved is not moved again and a
reference already in the new spelling is left alone, so it can be run any number of times.

What it does:

1. ``git mv`` each file of ``MOVES`` whose source still exists (creating the package folder and
   an ``__init__.py``). Merges and splits (``numbers`` + ``plaintext`` into ``untrusted``,
   ``store`` split into ``store.ledger``, ``store.lock`` and ``hooks.recorder``) were done by
   hand once; the reference tables below still map their old names.
2. Rewrite, in every Python file, the imports through ``ast``: ``from launcher import remote``
   becomes ``from launcher.host import run`` and the module's uses ``remote.x`` become
   ``run.x`` (or ``from launcher.host import run as remote`` where ``run`` is already a name in
   that file); an import from a split module (``SYMBOLS``) is split per defining module; a
   renamed class (``RENAMES``) is renamed at its definition, its imports and its uses
   (``ev.HostUnreachable``).
3. Rewrite dotted names in any text (``launcher.remote.run_dir`` in code, strings such as
   ``monkeypatch.setattr("launcher.remote....")``, ``python -m launcher.X``, the entry point
   ``launcher.cli:main``) and ``launcher/X.py`` paths in docs.
4. Run ``ruff check --select I --fix`` on the rewritten Python files (import order).

Re-running it on a branch made before the move: merge (or rebase onto) the branch that holds
the move first (git follows the renames of the moved files), then run
``python scripts/relayer.py`` in the branch's worktree: it rewrites the references in the
files the branch added or changed. Check with ``ruff``, ``mypy`` and
``pytest tests/test_architecture.py``.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "launcher"
DEFAULT_PATHS = ["launcher", "tests", "scripts", "configs", "systemd", "docs", "README.md",
                 "pyproject.toml"]
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".cfg", ".ini", ".sh", ".service", ".conf",
                 ".yml", ".yaml", ".json", ".example", ""}

LAYER_ORDER = ["leaf", "memory", "config", "store", "host", "plan", "supervise", "hooks", "cli"]

# (layer, old module, new module), names relative to ``launcher``. Old and new of one entry
# describe the same code; several old modules may map to one new module (a merge).
MODULE_TABLE: list[tuple[str, str, str]] = [
    ("leaf", "numbers", "untrusted"),
    ("leaf", "plaintext", "untrusted"),
    ("memory", "policy", "memory.policy"),
    ("memory", "sglang.budget", "sglang.modelfacts"),  # split: see SYMBOLS
    ("memory", "calibration", "memory.calibration"),
    ("config", "config", "config.schema"),
    ("config", "config_sources", "config.sources"),
    ("config", "config_problems", "config.problems"),
    ("config", "placeholders", "config.placeholders"),
    ("store", "store_lock", "store.lock"),
    ("store", "store_ledger", "store.ledger"),
    ("store", "store", "store.ledger"),  # split: see SYMBOLS
    ("host", "transport", "host.transport"),
    ("host", "transport.base", "host.transport.base"),
    ("host", "transport.local", "host.transport.local"),
    ("host", "transport.ssh", "host.transport.ssh"),
    ("host", "remote_shell", "host.shell"),
    ("host", "remote", "host.run"),
    ("host", "remote_preflight", "host.preflight"),
    ("host", "follow_agent", "host.agent"),
    ("host", "hostfollow", "host.follower"),
    ("host", "health", "host.health"),
    ("host", "gpus", "host.gpus"),
    ("host", "modelfacts", "host.facts"),
    ("host", "router_api", "host.router_api"),
    ("plan", "firstattempt", "plan.first_attempt"),
    ("plan", "command", "plan.command"),
    ("plan", "multinode", "plan.multinode"),
    ("plan", "fleet", "plan.fleet"),
    ("supervise", "events", "supervise.events"),
    ("supervise", "lifecycle", "supervise.lifecycle"),
    ("supervise", "backoff", "supervise.backoff"),
    ("supervise", "supervisor", "supervise.supervisor"),
    ("supervise", "ranks", "supervise.ranks"),
    ("supervise", "router", "supervise.router"),
    ("hooks", "notify", "hooks.slack"),
    ("hooks", "notify_messages", "hooks.messages"),
    ("hooks", "metrics", "hooks.metrics"),
    ("hooks", "systemd", "hooks.systemd"),
    ("hooks", "facts", "hooks.identity"),
    ("hooks", "eventlog", "hooks.logging"),
    ("cli", "cli", "cli.main"),
    ("cli", "inspection", "cli.inspection"),
    ("cli", "memview", "cli.memview"),
]

# Symbol-level moves: (old module, name) -> the module that defines it now. Used for modules
# that were split or that only re-exported (a shim, deleted).
SYMBOLS: dict[tuple[str, str], str] = {
    ("store", "LedgerRecorder"): "hooks.recorder",
    ("store", "StateLock"): "store.lock",
    ("store", "LOCK_FILENAME"): "store.lock",
    ("store", "_MIGRATIONS"): "store.ledger",
    # sglang/budget.py: the model facts stay (sglang.modelfacts), the estimate and the priors
    # move to the memory layer.
    ("sglang.budget", "DEFAULT_MARGIN"): "memory.estimate",
    ("sglang.budget", "KV_SHARE"): "memory.estimate",
    ("sglang.budget", "MIN_MARGIN_GIB"): "memory.estimate",
    ("sglang.budget", "Budget"): "memory.estimate",
    ("sglang.budget", "Choice"): "memory.estimate",
    ("sglang.budget", "Estimate"): "memory.estimate",
    ("sglang.budget", "GpuBar"): "memory.estimate",
    ("sglang.budget", "Observed"): "memory.estimate",
    ("sglang.budget", "choose"): "memory.estimate",
    ("sglang.budget", "estimate"): "memory.estimate",
    ("sglang.budget", "observed_bar"): "memory.estimate",
    ("sglang.budget", "DEFAULT_COEFFICIENTS"): "memory.priors",
    ("sglang.budget", "HIDDEN_ONLY_COEFFICIENTS"): "memory.priors",
    ("sglang.budget", "SOURCE_SHAPED_COEFFICIENTS"): "memory.priors",
    ("sglang.budget", "Coefficients"): "memory.priors",
}

# Renamed public names: (new module, old name) -> new name. One name, one class.
RENAMES: dict[tuple[str, str], str] = {
    ("sglang.logparse", "PhaseEntered"): "PhaseLine",
    ("supervise.events", "HostUnreachable"): "HostLost",
    ("supervise.lifecycle", "Event"): "LifecycleInput",
}

# Logger names are part of the output (JSON logs): never rewritten.
_KEEP_BEFORE = ('get_logger("', "get_logger('", 'getLogger("', "getLogger('")


def _tables(upto: str | None) -> tuple[dict[str, str], set[str], dict[tuple[str, str], str]]:
    """(old -> new module, the new modules, symbol moves) of the layers up to ``upto``."""
    last = LAYER_ORDER.index(upto) if upto else len(LAYER_ORDER) - 1
    modules = {old: new for layer, old, new in MODULE_TABLE
               if LAYER_ORDER.index(layer) <= last}
    symbols = {k: v for k, v in SYMBOLS.items() if k[0] in modules}
    return modules, set(modules.values()) | set(symbols.values()), symbols


class Rewriter:
    """Rewrites references per ``modules`` (old -> new), ``symbols`` and ``RENAMES``."""

    def __init__(self, upto: str | None) -> None:
        self.modules, self.new_modules, self.symbols = _tables(upto)
        self.new_packages = {n.rpartition(".")[0] for n in self.new_modules} - {""}

    # --- dotted names ---------------------------------------------------------------------

    def map_dotted(self, comps: list[str]) -> list[str] | None:
        """The new spelling of ``launcher.<comps>``, or None when it needs no change."""
        old = max((i for i in range(1, len(comps) + 1) if ".".join(comps[:i]) in self.modules),
                  default=0)
        new = max((i for i in range(1, len(comps) + 1)
                   if ".".join(comps[:i]) in self.new_modules), default=0)
        if old == 0 or new >= old:
            return None
        key = ".".join(comps[:old])
        rest = comps[old:]
        head = self.modules[key]
        if rest and (key, rest[0]) in self.symbols:
            head = self.symbols[(key, rest[0])]
        if rest and (head, rest[0]) in RENAMES:
            rest = [RENAMES[(head, rest[0])], *rest[1:]]
        return [*head.split("."), *rest]

    def rewrite_text(self, text: str) -> str:
        def dotted(m: re.Match[str]) -> str:
            if text[max(0, m.start() - 12):m.start()].endswith(_KEEP_BEFORE):
                return m.group(0)
            comps = m.group(1).split(".")[1:]
            # "from launcher.store import StateLock" inside a string: the name picks the module
            follows = re.match(r"\s+import\s+(\w+)", text[m.end():])
            if follows and (".".join([*comps, follows.group(1)]) in self.new_modules
                            or ".".join([*comps, follows.group(1)]) in self.new_packages):
                return m.group(0)  # "from launcher.cli import main": already the new package
            if follows and (".".join(comps), follows.group(1)) in self.symbols:
                comps = [*comps, follows.group(1)]
                new = self.map_dotted(comps)
                return m.group(0) if new is None else "launcher." + ".".join(new[:-1])
            new = self.map_dotted(comps)
            return m.group(0) if new is None else "launcher." + ".".join(new)

        text = re.sub(r"(?<![\w.])launcher((?:\.[A-Za-z_]\w*)+)", dotted, text)

        def path(m: re.Match[str]) -> str:
            comps = m.group(1).split("/")
            if comps[-1] == "__init__":
                return m.group(0)
            new = self.map_dotted(comps)
            return m.group(0) if new is None else "launcher/" + "/".join(new) + ".py"

        text = re.sub(r"(?<![\w/.~-])launcher/([\w/]+)\.py\b", path, text)
        for old, new in self.modules.items():
            if "." not in old and "." in new and (PKG / new.replace(".", "/")).is_dir():
                text = re.sub(rf"(?<![\w/.~-])launcher/{old}(?=/|\b)(?!\.py)",
                              "launcher/" + new.replace(".", "/"), text)
        return text

    # --- Python imports -------------------------------------------------------------------

    def _is_module(self, dotted: str) -> bool:
        return dotted in self.modules or dotted in self.new_modules \
            or dotted in self.new_packages or (PKG / dotted.replace(".", "/")).exists() \
            or (PKG / (dotted.replace(".", "/") + ".py")).exists()

    def _new_module(self, mod: str) -> str:
        new = self.map_dotted(mod.split(".")) if mod else None
        return ".".join(new) if new else mod

    def rewrite_python(self, text: str) -> str:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            return text
        lines = text.splitlines(keepends=True)
        offsets = [0]
        for line in lines:
            offsets.append(offsets[-1] + len(line))

        def pos(lineno: int, col: int) -> int:
            # ast columns are UTF-8 byte offsets
            line = lines[lineno - 1]
            return offsets[lineno - 1] + len(line.encode()[:col].decode(errors="ignore"))

        identifiers: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                identifiers.add(node.id)
            elif isinstance(node, ast.arg):
                identifiers.add(node.arg)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                identifiers.add(node.name)
            elif isinstance(node, ast.alias):
                identifiers.add(node.asname or node.name.split(".")[0])

        edits: list[tuple[int, int, str]] = []
        name_renames: dict[str, str] = {}  # local name -> new local name
        module_names: dict[str, str] = {}  # local name -> new module it is bound to
        for node in ast.walk(tree):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    and (node.module == "launcher" or node.module.startswith("launcher."))):
                continue
            base = node.module[len("launcher."):] if node.module != "launcher" else ""
            groups: dict[str, list[str]] = {}
            changed = False
            for alias in node.names:
                full = f"{base}.{alias.name}" if base else alias.name
                local = alias.asname or alias.name
                if self._is_module(full):
                    new_full = self._new_module(full)
                    module_names[local] = new_full
                    target, _, name = new_full.rpartition(".")
                    if new_full != full:
                        changed = True
                        if alias.asname is None and name != alias.name:
                            if name in identifiers:
                                alias_as = alias.name
                            else:
                                alias_as = None
                                name_renames[alias.name] = name
                        else:
                            alias_as = alias.asname
                    else:
                        alias_as = alias.asname
                else:
                    target = self._new_module(base)
                    if (base, alias.name) in self.symbols:
                        target = self.symbols[(base, alias.name)]
                    name = RENAMES.get((target, alias.name), alias.name)
                    alias_as = alias.asname
                    if name != alias.name and alias.asname is None:
                        name_renames[alias.name] = name
                    changed |= target != base or name != alias.name
                text_alias = name if alias_as is None else f"{name} as {alias_as}"
                groups.setdefault(target, []).append(text_alias)
            if not changed:
                continue
            indent = " " * node.col_offset
            stmts = []
            for target, names in groups.items():
                module = f"launcher.{target}" if target else "launcher"
                one = f"from {module} import {', '.join(names)}"
                if len(indent) + len(one) <= 100:
                    stmts.append(one)
                else:
                    body = "".join(f"{indent}    {n},\n" for n in names)
                    stmts.append(f"from {module} import (\n{body}{indent})")
            assert node.end_lineno is not None and node.end_col_offset is not None
            edits.append((pos(node.lineno, node.col_offset),
                          pos(node.end_lineno, node.end_col_offset),
                          f"\n{indent}".join(stmts)))

        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                mod = module_names.get(node.value.id)
                new_attr = RENAMES.get((mod, node.attr)) if mod else None
                if new_attr:
                    assert node.end_lineno is not None and node.end_col_offset is not None
                    end = pos(node.end_lineno, node.end_col_offset)
                    edits.append((end - len(node.attr), end, new_attr))
            if isinstance(node, ast.Name) and node.id in name_renames:
                assert node.end_lineno is not None and node.end_col_offset is not None
                edits.append((pos(node.lineno, node.col_offset),
                              pos(node.end_lineno, node.end_col_offset),
                              name_renames[node.id]))
        for start, end, new in sorted(set(edits), reverse=True):
            text = text[:start] + new + text[end:]
        return text


def _files(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        path = (ROOT / p) if not Path(p).is_absolute() else Path(p)
        if path.is_dir():
            out += [f for f in sorted(path.rglob("*")) if f.is_file()
                    and f.suffix in TEXT_SUFFIXES and "__pycache__" not in f.parts
                    and ".venv" not in f.parts]
        elif path.is_file():
            out.append(path)
    return out


def _module_of(path: Path) -> str | None:
    try:
        rel = path.resolve().relative_to(PKG)
    except ValueError:
        return None
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def rename_in_definer(text: str, module: str) -> str:
    """In the module that defines a renamed name: the definition, bare uses, ``__all__``."""
    for (definer, old), new in RENAMES.items():
        if definer != module:
            continue
        tree = ast.parse(text)
        spans: list[tuple[int, int]] = []
        lines = text.splitlines(keepends=True)
        offsets = [0]
        for line in lines:
            offsets.append(offsets[-1] + len(line))
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id == old:
                start = offsets[node.lineno - 1] + node.col_offset
                spans.append((start, start + len(old)))
            elif isinstance(node, ast.ClassDef) and node.name == old:
                line = lines[node.lineno - 1]
                start = offsets[node.lineno - 1] + line.index(f"class {old}") + len("class ")
                spans.append((start, start + len(old)))
            elif isinstance(node, ast.Constant) and node.value == old:
                start = offsets[node.lineno - 1] + node.col_offset + 1
                spans.append((start, start + len(old)))
        for start, end in sorted(set(spans), reverse=True):
            text = text[:start] + new + text[end:]
    return text


def move_files(upto: str | None) -> None:
    """``git mv`` the modules of the layers up to ``upto`` whose source still exists."""
    last = LAYER_ORDER.index(upto) if upto else len(LAYER_ORDER) - 1
    for layer, old, new in MODULE_TABLE:
        if LAYER_ORDER.index(layer) > last:
            continue
        if sum(1 for _, o, n in MODULE_TABLE if n == new) > 1:
            continue  # a merge or split: done by hand
        src_dir = PKG / old.replace(".", "/")
        src = src_dir.with_suffix(".py")
        dest_dir = PKG / new.replace(".", "/")
        if (src_dir / "__init__.py").exists() and not new.startswith(old + "."):
            src, dest = src_dir, dest_dir
        elif src.is_file():
            dest = dest_dir.with_suffix(".py")
        else:
            continue
        if dest.exists():
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        init = dest.parent / "__init__.py"
        if dest.parent != PKG and not init.exists():
            init.write_text(f'"""launcher\'s {dest.parent.name} layer."""\n')
            subprocess.run(["git", "add", str(init)], cwd=ROOT, check=True)
        subprocess.run(["git", "mv", str(src), str(dest)], cwd=ROOT, check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", default=DEFAULT_PATHS)
    parser.add_argument("--upto", choices=LAYER_ORDER)
    parser.add_argument("--no-move", action="store_true")
    args = parser.parse_args(argv)
    if not args.no_move:
        move_files(args.upto)
    rewriter = Rewriter(args.upto)
    me = Path(__file__).resolve()
    changed: list[Path] = []
    for path in _files(args.paths):
        if path.resolve() == me:
            continue  # its tables name the old modules on purpose
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        new = text
        if path.suffix == ".py":
            module = _module_of(path)
            if module is not None:
                new = rename_in_definer(new, module)
            new = rewriter.rewrite_python(new)
        new = rewriter.rewrite_text(new)
        if new != text:
            path.write_text(new)
            changed.append(path)
    py = [str(p) for p in changed if p.suffix == ".py"]
    if py:
        subprocess.run([sys.executable, "-m", "ruff", "check", "--select", "I", "--fix",
                        "--quiet", *py], cwd=ROOT, check=False)
    for p in changed:
        print(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p)
    return 0


if __name__ == "__main__":
    sys.exit(main())

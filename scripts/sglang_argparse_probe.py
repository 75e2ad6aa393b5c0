"""Parse command lines with SGLang's own argument parser and print what it made of them.

Runs inside the contract env (``scripts/sglang-contract-env.sh``), never in launcher's venv::

    .venv-sglang/bin/python scripts/sglang_argparse_probe.py --sglang-version 0.5.23 < argvs.json

stdin: a JSON list of argv lists, each the arguments after ``python -m sglang.launch_server``.
stdout: one JSON object::

    {"sglang_version": "0.5.23", "prog": "sglang serve", "results": [
        {"argv": [...], "ok": true, "exit_code": 0, "values": {...}, "namespace": {...},
         "stderr": "..."},
        {"argv": [...], "ok": false, "exit_code": 2, "error": "sglang serve: error: ...",
         "stderr": "..."}]}

``values`` holds the settings launcher controls under one name across versions: ``tp_size`` and
``dp_size`` (0.5.10 keeps them in ``tensor_parallel_size`` / ``data_parallel_size``),
``cuda_graph_max_bs`` (``cuda_graph_max_bs_decode`` from 0.5.15, named in ``graph_bs_dest``),
``mem_fraction_static``, ``host``, ``port``, ``model_path``, ``served_model_name``,
``log_level`` and ``context_length``. ``namespace`` is the whole argparse namespace (values that
JSON cannot hold are given as their repr).

The parser is built as SGLang's ``prepare_server_args`` builds it: ``ArgumentParser(prog=...)``,
``ServerArgs.add_cli_args(parser)``, ``parser.parse_args(argv)``. ``prepare_server_args`` itself
is not called: it goes on to resolve the auto settings, which needs a GPU (0.5.6) or a model.
``prog`` is read from the version's ``prepare_server_args`` source ("sglang serve" in 0.5.10 and
later); a version that leaves it to argparse gets "launch_server.py", what argparse shows for
``python -m sglang.launch_server``.

Each version lives in ``<venv>/sglang/<version>`` and is put first on ``sys.path`` here, so one
venv serves every version (one per process).

Stub: ``torchvision`` is served by an empty stand-in module, whatever name is asked of it
(``from torchvision.io import decode_jpeg`` in 0.5.10's ``srt/utils/common.py``, for instance).
PyPI's torchvision cannot be installed beside the CPU torch (it brings a CUDA torch, or fails to
load its operators), and argparse never calls into it: the imports only bind names. The stand-in
has version "0.0.0+stub", so that transformers' version checks see an old torchvision rather than
failing on a missing version. It sits last on ``sys.meta_path``, so a real torchvision wins.

Exit status: 0 when every command line was parsed (accepted or not); 1 with a message on stderr
when SGLang could not be imported or the input is malformed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import inspect
import io
import json
import re
import sys
import types
from pathlib import Path
from typing import Any

STUBBED = frozenset({"torchvision"})
STUB_VERSION = "0.0.0+stub"


class _Stub:
    """Any attribute of a stubbed module: itself has any attribute, and calling it gives one."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _Stub:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Stub(f"{self._name}.{attr}")

    def __call__(self, *args: object, **kwargs: object) -> _Stub:
        return _Stub(f"{self._name}()")

    def __mro_entries__(self, bases: tuple[object, ...]) -> tuple[type, ...]:
        # ``class X(torchvision.Something)`` at module level: derive from object instead.
        return (object,)

    def __repr__(self) -> str:
        return f"<stub {self._name}>"


class _StubModule(types.ModuleType):
    def __getattr__(self, attr: str) -> _Stub:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Stub(f"{self.__name__}.{attr}")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves every module under the ``STUBBED`` roots as a ``_StubModule`` package."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] not in STUBBED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        setattr(module, "__version__", STUB_VERSION)  # noqa: B010 (ModuleType declares none)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _first(ns: argparse.Namespace, *dests: str) -> tuple[Any, str | None]:
    for dest in dests:
        if hasattr(ns, dest):
            return getattr(ns, dest), dest
    return None, None


def _values(ns: argparse.Namespace) -> dict[str, Any]:
    tp, _ = _first(ns, "tp_size", "tensor_parallel_size")
    dp, _ = _first(ns, "dp_size", "data_parallel_size")
    graph_bs, graph_dest = _first(ns, "cuda_graph_max_bs_decode", "cuda_graph_max_bs")
    return {
        "model_path": ns.model_path,
        "served_model_name": getattr(ns, "served_model_name", None),
        "tp_size": tp,
        "dp_size": dp,
        "host": ns.host,
        "port": ns.port,
        "mem_fraction_static": ns.mem_fraction_static,
        "cuda_graph_max_bs": graph_bs,
        "graph_bs_dest": graph_dest,
        "log_level": ns.log_level,
        "context_length": getattr(ns, "context_length", None),
    }


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


def _prog(prepare_server_args: Any) -> str:
    try:
        source = inspect.getsource(prepare_server_args)
    except (OSError, TypeError):
        source = ""
    found = re.search(r"ArgumentParser\(\s*prog\s*=\s*[\"']([^\"']+)[\"']", source)
    return found.group(1) if found else "launch_server.py"


def _parse_one(parser: argparse.ArgumentParser, argv: list[str]) -> dict[str, Any]:
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
            ns = parser.parse_args(argv)
    except SystemExit as exc:
        text = captured.getvalue()
        lines = [line for line in text.splitlines() if line.strip()]
        code = exc.code if isinstance(exc.code, int) else 1
        # The usage block runs to thousands of lines; the verdict is the last one.
        return {
            "argv": argv,
            "ok": False,
            "exit_code": code,
            "error": lines[-1] if lines else "",
            "stderr": "" if lines and "usage:" in text else text,
        }
    return {
        "argv": argv,
        "ok": True,
        "exit_code": 0,
        "values": _values(ns),
        "namespace": {k: _jsonable(v) for k, v in sorted(vars(ns).items())},
        "stderr": captured.getvalue(),
    }


def main() -> int:
    """Parse the argv lists on stdin with ``--sglang-version``'s parser; JSON on stdout."""
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--sglang-version", required=True, help="a folder under <venv>/sglang/")
    cli.add_argument(
        "--sglang-root",
        type=Path,
        default=Path(sys.prefix) / "sglang",
        help="where the version folders are (default: <this venv>/sglang)",
    )
    args = cli.parse_args()
    code_dir = args.sglang_root / args.sglang_version
    if not (code_dir / "sglang").is_dir():
        sys.stderr.write(f"probe: no SGLang in {code_dir}: run scripts/sglang-contract-env.sh\n")
        return 1
    try:
        argvs = json.load(sys.stdin)
    except ValueError as exc:
        sys.stderr.write(f"probe: stdin is not JSON: {exc}\n")
        return 1
    if not isinstance(argvs, list) or not all(
        isinstance(a, list) and all(isinstance(s, str) for s in a) for a in argvs
    ):
        sys.stderr.write("probe: stdin must be a JSON list of lists of strings\n")
        return 1

    sys.path.insert(0, str(code_dir))
    sys.meta_path.append(_StubFinder())
    real_stdout = sys.stdout
    # SGLang and its imports may print; only the JSON below goes to stdout.
    with contextlib.redirect_stdout(sys.stderr):
        import sglang  # type: ignore[import-not-found]
        from sglang.srt.server_args import (  # type: ignore[import-not-found]
            ServerArgs,
            prepare_server_args,
        )

        loaded_from = Path(sglang.__path__[0]).resolve()
        if not loaded_from.is_relative_to(code_dir.resolve()):
            sys.stderr.write(f"probe: sglang was imported from {loaded_from}, not {code_dir}\n")
            return 1
        version = importlib.metadata.version("sglang")
        if version != args.sglang_version:
            sys.stderr.write(f"probe: {code_dir} holds sglang {version}\n")
            return 1
        prog = _prog(prepare_server_args)
        parser = argparse.ArgumentParser(prog=prog)
        ServerArgs.add_cli_args(parser)
        results = [_parse_one(parser, list(argv)) for argv in argvs]

    json.dump({"sglang_version": version, "prog": prog, "results": results}, real_stdout, indent=1)
    real_stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`launcher diagnose`: classify an SGLang log and say what the policy would launch next."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Annotated

import typer
import typer.core

from launcher.cli.app import (
    JsonOpt,
    err,
    fail,
    guard,
    out,
    say,
)
from launcher.cli.memview import bar_text, legend
from launcher.errors import (
    UsageError,
)
from launcher.memory.estimate import observed_bar
from launcher.memory.policy import AttemptRecord, Bounds, next_params
from launcher.params import LaunchParams
from launcher.sglang.classify import diagnose_text
from launcher.sglang.outcome import Diagnosis
from launcher.sglang.versions import DEFAULT_VERSION

_PARAM_NAMES = ("mem_fraction_static", "cuda_graph_max_bs")


def _parse_params(text: str | None) -> dict[str, float | int]:
    """``--params mem_fraction_static=0.85,cuda_graph_max_bs=32`` (dashes allowed in names)."""
    out: dict[str, float | int] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        key = name.strip().lstrip("-").replace("-", "_")
        if not sep or key not in _PARAM_NAMES:
            raise UsageError(
                f"--params: cannot read {item.strip()!r}",
                remedy="give name=value pairs separated by commas, names "
                + " and ".join(_PARAM_NAMES),
            )
        try:
            out[key] = float(value) if key == "mem_fraction_static" else int(value)
        except ValueError:
            raise UsageError(
                f"--params: {key}={value.strip()!r} is not a number",
                remedy="e.g. mem_fraction_static=0.85,cuda_graph_max_bs=32",
            ) from None
    mfs = out.get("mem_fraction_static")
    if mfs is not None and not 0 < mfs < 1:
        raise UsageError(
            f"--params: mem_fraction_static={mfs} is outside (0, 1)",
            remedy="give the fraction the server was launched with, e.g. 0.85",
        )
    return out


def _launched(
    diag: Diagnosis, given: dict[str, float | int]
) -> tuple[LaunchParams, dict[str, str]]:
    """The params the server was launched with: the log's server_args dump first, then
    ``--params``; and where each came from ("log", "--params" or "unknown")."""
    n = diag.numbers
    from_log = {
        "mem_fraction_static": n.mem_fraction_static,
        "cuda_graph_max_bs": n.cuda_graph_max_bs,
    }
    values: dict[str, float | int | None] = {}
    source: dict[str, str] = {}
    for key in _PARAM_NAMES:
        logged = from_log[key]
        values[key] = logged if logged is not None else given.get(key)
        source[key] = "log" if logged is not None else "--params" if key in given else "unknown"
    mfs, bs = values["mem_fraction_static"], values["cuda_graph_max_bs"]
    launched = LaunchParams(None if mfs is None else float(mfs), None if bs is None else int(bs))
    return launched, source


def _policy_next(
    diag: Diagnosis, launched: LaunchParams, sglang_version: str
) -> LaunchParams | str:
    record = AttemptRecord(launched, diag.outcome, diag.phase, diag.numbers)
    decision = next_params(launched, Bounds(), [record], sglang_version=sglang_version)
    return decision.params if decision.params is not None else decision.reason


# Not "--mamba-scheduler-strategy": 0.5.23 names it too, rejecting it as unrecognized.
_OLD_LOG_MARKS = ("server_args=ServerArgs(", "Init torch distributed begin")


def _log_version(text: str) -> str:
    """The SGLang version a log's shape suggests: 0.5.23 dumps its args as a dict and says
    "Init parallel"; older ones print ``ServerArgs(...)`` and "Init torch distributed" (their
    flag dialect is 0.5.10's). Without either, 0.5.23; ``--sglang-version`` overrides."""
    return "0.5.10" if any(mark in text for mark in _OLD_LOG_MARKS) else DEFAULT_VERSION


def _sentence(text: str) -> str:
    """``text`` ending with a full stop (or the stop it has), so that another sentence can
    follow it."""
    text = text.rstrip()
    return text if not text or text[-1] in ".!?" else f"{text}."


_NOT_TEXT = re.compile(r"[\ufffd\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _mostly_binary(raw: bytes) -> bool:
    """More than a third of ``raw``'s characters are not text (not UTF-8, or control
    characters other than tab, newline and carriage return): not a log."""
    text = raw.decode("utf-8", errors="replace")
    return len(_NOT_TEXT.findall(text)) * 3 > len(text)


def diagnose(
    logfile: Annotated[Path, typer.Argument(
        metavar="LOGFILE", help="An SGLang log (or its tail); - reads it from stdin.")],
    as_json: JsonOpt = False,
    exit_status: Annotated[
        int | None, typer.Option("--exit-status", help="The process's exit status, if known.")
    ] = None,
    params: Annotated[
        str | None,
        typer.Option(
            "--params",
            help="Launch params the log does not show, e.g. "
            "mem_fraction_static=0.85,cuda_graph_max_bs=32 (the log's server_args win).",
        ),
    ] = None,
    sglang_version: Annotated[
        str | None,
        typer.Option("--sglang-version", help="The server's SGLang version (default: from the "
                     "log's shape, 0.5.10 or 0.5.23); advice uses its flag dialect."),
    ] = None,
) -> None:
    """Classify an SGLang start-up log: outcome, confidence, phase, evidence, advice."""
    given = guard(lambda: _parse_params(params))
    try:
        raw = sys.stdin.buffer.read() if str(logfile) == "-" else logfile.read_bytes()
    except OSError as exc:
        fail(
            UsageError(
                f"{logfile}: cannot read: {exc.strerror}",
                remedy="pass the path of an SGLang log file, or - to read it from stdin",
            )
        )
    name = "stdin" if str(logfile) == "-" else str(logfile)
    if not raw.strip():
        say(err, f"{name}: the log is empty: nothing to diagnose (the server wrote nothing "
            "yet, or this is not its log)")
        raise typer.Exit(1)
    if _mostly_binary(raw):
        fail(UsageError(f"{name}: not a text log (most of its bytes are not text)",
                        remedy="pass an SGLang log file"))
    # Bytes that are not UTF-8 read as \xNN, as control characters are shown: the evidence
    # quotes lines of the log, and nothing of them reaches the terminal raw.
    text = raw.decode("utf-8", errors="backslashreplace")
    version = sglang_version or _log_version(text)
    diag = diagnose_text(text, exit_status, sglang_version=version)
    data = diag.as_dict()
    if diag.outcome.is_memory:
        launched, source = _launched(diag, given)
        unknown = [k for k, v in source.items() if v == "unknown"]
        data["params_source"] = source
        if unknown:  # never invent them from assumed defaults
            data["next_params"] = None
            data["advice"] = (
                f"{_sentence(diag.advice)} Next attempt: not computed, the log does not show "
                f"{' and '.join(unknown)}; pass --params {unknown[0]}=..."
            )
        else:
            nxt = _policy_next(diag, launched, version)
            if isinstance(nxt, LaunchParams):
                data["next_params"] = nxt.as_dict()
                data["advice"] = f"{_sentence(diag.advice)} Next attempt: {nxt.describe()}."
            else:
                data["next_params"] = None
                data["advice"] = f"{_sentence(diag.advice)} Policy: {nxt}"
    observed = observed_bar(diag.numbers, diag.phase.value) if diag.outcome.is_memory else None
    data["memory"] = None
    if observed is not None:
        data["memory"] = [{**observed.bar.as_dict(), "broke": observed.broke,
                           "deficit_gib": None if observed.deficit_gib is None
                           else round(observed.deficit_gib, 2)}]
    if as_json:
        out.print_json(json.dumps(data))
    else:
        say(out, ("outcome", "bold"), f"  {diag.outcome.value}  (phase {diag.phase.value}"
             f"{', rank ' + diag.rank if diag.rank else ''}; {diag.confidence.value})")
        say(out, ("retry", "bold"), f"    {'yes' if diag.retryable else 'no'}")
        if data["numbers"]:
            nums = ", ".join(f"{k}={v}" for k, v in data["numbers"].items())
            say(out, ("numbers", "bold"), f"  {nums}")
        say(out, ("advice", "bold"), f"   {data['advice']}")
        for remark in diag.remarks:
            say(out, ("note", "bold"), f"     {remark}")
        if observed is not None:
            say(out, ("memory", "bold"), f"   as the log shows it; broke in {observed.broke}")
            out.print(bar_text(observed.bar, label=f"GPU {observed.bar.index}",
                               mfs=observed.mem_fraction_static,
                               deficit_gib=observed.deficit_gib), soft_wrap=True)
            out.print(legend(observed.bar), soft_wrap=True)
        if diag.evidence:
            say(out, ("evidence", "bold"))
            for line in diag.evidence:
                say(out, f"  {line}")
    raise typer.Exit(0 if diag.outcome.value == "ready" else 1)

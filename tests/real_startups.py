"""Real SGLang start-ups (tests/fixtures/real_startups/): one directory per start-up.

A case directory holds ``log.txt`` (verbatim log lines of one start-up), ``config.json`` (the
model's official Hugging Face config), ``draft_config.json`` when a separate speculative draft
model has its own config (``draft_config_exact`` says whether it is the draft repo's own file or
a reference config of the same geometry), and ``case.toml`` (provenance, layout, flags and every
figure the log shows, units in the key names). ``load_case`` reads one directory into a typed
``Case`` and rejects it with ``CaseError`` (naming the file, the key and the fix) when it does not
follow the schema or its figures contradict each other; ``load_cases`` reads every directory
under the root. The loader takes any case directory, whichever source prefix (``docs-``, ``gh<n>-``,
``ext-<repo>-``) it has.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent / "fixtures" / "real_startups"

SOURCE_KINDS = frozenset({"sglang-docs", "github-issue", "other"})
KINDS = frozenset({"dense", "moe", "mla", "speculative", "hybrid", "multimodal", "quantized"})
ID_PATTERN = re.compile(r"^(docs|gh\d+|ext-[a-z0-9]+(-[a-z0-9]+)*)-[a-z0-9]+(-[a-z0-9]+)*$")
# Figures that are counts, not sizes or times (kv_tokens, max_total_num_tokens, context_len,
# max_running_requests, max_mamba_cache_size, ...); a draft_ prefix names the draft model's own.
COUNT_SUFFIXES = ("tokens", "_len", "_requests", "_cache_size", "_count", "_bs")
# Every other figure carries its unit in its name.
UNIT_SUFFIXES = ("_gb", "_gib", "_s")
# SGLang prints GB with two decimals; a difference of two printed figures is off by at most
# one unit in the last place of each.
TOLERANCE_GB = 0.02
# "mem usage" figures are SGLang's difference of two free-memory readings, so they go negative
# when free memory rises during the phase (an EAGLE-3 draft graph capture prints -0.14 GB).
SIGNED_SUFFIX = "mem_usage_gb"

REQUIRED_STR = (
    "id", "source_url", "source_kind", "retrieved", "config_url", "draft_config_url",
    "weights_index_url", "model", "draft_model", "sglang_version", "sglang_version_basis",
    "gpu", "gpu_basis", "dtype", "quantization", "attention_backend", "note",
)
REQUIRED_INT = ("weights_total_bytes", "tp", "dp", "ep", "pp", "nnodes")
FLAG_TYPES: dict[str, type] = {
    "mem_fraction_static": float,
    "cuda_graph_max_bs": int,
    "chunked_prefill_size": int,
    "max_running_requests": int,
    "context_length": int,
    "speculative_algorithm": str,
    "speculative_num_steps": int,
    "speculative_eagle_topk": int,
    "speculative_num_draft_tokens": int,
    "disable_cuda_graph": bool,
}
PASS_KEYS = ("begin_avail_gb", "end_avail_gb", "mem_usage_gb", "time_s")


class CaseError(ValueError):
    """A case directory that does not follow the schema; the message names file, key and fix."""


@dataclass(frozen=True)
class GraphPass:
    """One ``Capture cuda graph begin``/``end`` pair, as the log prints it."""

    name: str
    begin_avail_gb: float | None
    end_avail_gb: float | None
    mem_usage_gb: float | None
    time_s: float | None


@dataclass(frozen=True)
class Flags:
    """Server flags from ``server_args=ServerArgs(...)`` or the launch command.

    0 and "" mean the flag is not shown.
    """

    mem_fraction_static: float
    cuda_graph_max_bs: int
    chunked_prefill_size: int
    max_running_requests: int
    context_length: int
    speculative_algorithm: str
    speculative_num_steps: int
    speculative_eagle_topk: int
    speculative_num_draft_tokens: int
    disable_cuda_graph: bool


@dataclass(frozen=True)
class Case:
    """One real start-up: provenance, layout, flags, figures, the log and the model config."""

    id: str
    path: Path
    source_url: str
    source_kind: str
    retrieved: dt.date
    config_url: str
    draft_config_url: str
    weights_total_bytes: int
    weights_index_url: str
    model: str
    draft_model: str
    sglang_version: str
    sglang_version_basis: str
    gpu: str
    gpu_total_gib: float
    gpu_basis: str
    tp: int
    dp: int
    ep: int
    pp: int
    nnodes: int
    kinds: tuple[str, ...]
    dtype: str
    quantization: str
    attention_backend: str
    note: str
    html_unescaped: bool
    flags: Flags
    figures: Mapping[str, float | int]
    graph_passes: tuple[GraphPass, ...]
    log: str
    config: Mapping[str, Any]
    draft_config: Mapping[str, Any] | None
    # False when draft_config.json is not the draft repo's own file but a reference config of the
    # same geometry (e.g. SafeAILab/EAGLE's, whose ``architectures`` differs); True otherwise,
    # including cases without a separate draft.
    draft_config_exact: bool = True

    @property
    def kv_pool_tokens(self) -> int | None:
        """Tokens in the target's KV pool.

        ``kv_tokens`` where the KV line prints ``#tokens``, else ``max_total_num_tokens`` (SGLang
        before 0.4.3.post3 printed the KV line without ``#tokens``, and before 0.4.1.post7 no KV
        line at all); None when neither is shown.
        """
        value = self.figures.get("kv_tokens", self.figures.get("max_total_num_tokens"))
        return None if value is None else int(value)


def _fail(where: Path, message: str) -> CaseError:
    return CaseError(f"{where}: {message}")


def _get(table: Mapping[str, Any], key: str, kind: type, where: Path) -> Any:
    if key not in table:
        raise _fail(where, f"missing key {key!r}: add it (see REAL_STARTUPS schema in case.toml)")
    value = table[key]
    # bool is an int in Python; a count must not be written as true/false, nor a flag as 0/1.
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok:
        raise _fail(where, f"{key!r} is {value!r}: write a {kind.__name__}")
    return float(value) if kind is float else value


def _figures(raw: Mapping[str, Any], where: Path) -> dict[str, float | int]:
    figures: dict[str, float | int] = {}
    for key, value in raw.items():
        if key == "graph_passes":
            continue
        if key.endswith(COUNT_SUFFIXES):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise _fail(where, f"[figures] {key} = {value!r}: a count is a whole number >= 0")
        elif key.endswith(UNIT_SUFFIXES):
            negative_ok = key.endswith(SIGNED_SUFFIX)
            if (
                not isinstance(value, int | float)
                or isinstance(value, bool)
                or (value < 0 and not negative_ok)
            ):
                raise _fail(where, f"[figures] {key} = {value!r}: write the number the log prints")
        else:
            raise _fail(
                where,
                f"[figures] {key}: end the name with its unit ({', '.join(UNIT_SUFFIXES)}) "
                f"or, for a count, with one of {', '.join(COUNT_SUFFIXES)}",
            )
        figures[key] = value
    return figures


def _graph_passes(raw: Any, where: Path) -> tuple[GraphPass, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _fail(where, "[[figures.graph_passes]] must be an array of tables")
    passes = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict) or not isinstance(entry.get("pass"), str):
            raise _fail(where, f"graph_passes[{i}]: give pass = \"decode\" (or the log's name)")
        unknown = set(entry) - {"pass", *PASS_KEYS}
        if unknown:
            raise _fail(where, f"graph_passes[{i}]: unknown keys {sorted(unknown)}")
        values: dict[str, float | None] = {}
        for key in PASS_KEYS:
            value = entry.get(key)
            negative_ok = key == "mem_usage_gb"
            if value is not None and (
                not isinstance(value, int | float)
                or isinstance(value, bool)
                or (value < 0 and not negative_ok)
            ):
                raise _fail(
                    where,
                    f"graph_passes[{i}].{key} = {value!r}: a number >= 0 "
                    "(only mem_usage_gb, a difference, may be negative)",
                )
            values[key] = None if value is None else float(value)
        passes.append(GraphPass(name=entry["pass"], **values))
    return tuple(passes)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= TOLERANCE_GB + 1e-9


def _check_consistency(case: Case, where: Path) -> None:
    """Figures that SGLang derives from each other must agree to the printed precision."""
    f = case.figures
    for prefix in ("", "draft_"):
        begin, end, usage = (
            f.get(f"{prefix}load_weight_begin_avail_gb"),
            f.get(f"{prefix}load_weight_end_avail_gb"),
            f.get(f"{prefix}weight_mem_usage_gb"),
        )
        if begin is not None and end is not None and usage is not None and not _close(
            begin - end, usage
        ):
            raise _fail(
                where,
                f"{prefix}load_weight_begin_avail_gb - {prefix}load_weight_end_avail_gb = "
                f"{begin - end:.2f} but {prefix}weight_mem_usage_gb = {usage}: one of the "
                "three is misread from the log",
            )
        if f"{prefix}kv_tokens" in f:
            split = f"{prefix}k_size_gb" in f and f"{prefix}v_size_gb" in f
            if not split and f"{prefix}kv_size_gb" not in f:
                raise _fail(
                    where,
                    f"{prefix}kv_tokens without its size: add {prefix}k_size_gb and "
                    f"{prefix}v_size_gb (or {prefix}kv_size_gb for MLA) as the log prints them",
                )
    # The pool's token count: "KV Cache is allocated. #tokens: N" (SGLang >= 0.4.3.post3), else
    # the "max_total_num_tokens=N" line that every version prints once the pool is allocated.
    if "kv_tokens" not in f and "max_total_num_tokens" not in f:
        raise _fail(
            where,
            "[figures] has neither kv_tokens nor max_total_num_tokens: a case reaches the KV "
            "pool ('KV Cache is allocated. #tokens' or 'max_total_num_tokens=')",
        )
    for i, graph in enumerate(case.graph_passes):
        if None not in (graph.begin_avail_gb, graph.end_avail_gb, graph.mem_usage_gb):
            assert graph.begin_avail_gb is not None and graph.end_avail_gb is not None
            assert graph.mem_usage_gb is not None
            if not _close(graph.begin_avail_gb - graph.end_avail_gb, graph.mem_usage_gb):
                raise _fail(
                    where,
                    f"graph_passes[{i}] ({graph.name}): begin {graph.begin_avail_gb} - end "
                    f"{graph.end_avail_gb} != mem usage {graph.mem_usage_gb}",
                )
    begin, end, usage = (
        f.get("graph_begin_avail_gb"), f.get("graph_end_avail_gb"), f.get("graph_end_mem_usage_gb")
    )
    if begin is not None and end is not None and usage is not None and not _close(
        begin - end, usage
    ):
        raise _fail(where, f"graph_begin_avail_gb - graph_end_avail_gb != {usage} (mem usage)")


def _json_object(path: Path, where: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise _fail(where, f"{path.name} does not parse as JSON ({exc}): copy it verbatim") from exc
    if not isinstance(value, dict):
        raise _fail(where, f"{path.name} is not a JSON object: copy the model's config.json")
    return value


def load_case(directory: Path) -> Case:
    """Read and check one case directory; ``CaseError`` names what is wrong and how to fix it."""
    toml_path = directory / "case.toml"
    try:
        raw = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise _fail(toml_path, f"unreadable ({exc})") from exc
    if "held_out" in raw:
        raise _fail(toml_path, "held_out is decided by bench_real's split (sha256 of the id): "
                    "remove the key")
    values: dict[str, Any] = {key: _get(raw, key, str, toml_path) for key in REQUIRED_STR}
    values |= {key: _get(raw, key, int, toml_path) for key in REQUIRED_INT}
    case_id = values["id"]
    if case_id != directory.name:
        raise _fail(toml_path, f"id {case_id!r} differs from the directory name {directory.name!r}")
    if not ID_PATTERN.match(case_id):
        raise _fail(toml_path, f"id {case_id!r}: docs-/gh<n>-/ext-<repo>- then [a-z0-9-]")
    if values["source_kind"] not in SOURCE_KINDS:
        raise _fail(
            toml_path, f"source_kind {values['source_kind']!r}: one of {sorted(SOURCE_KINDS)}"
        )
    for key in ("source_url", "config_url"):
        if not values[key].startswith("https://"):
            raise _fail(toml_path, f"{key} {values[key]!r}: a public https:// address")
    try:
        retrieved = dt.date.fromisoformat(values.pop("retrieved"))
    except ValueError as exc:
        raise _fail(toml_path, "retrieved: write the date as YYYY-MM-DD") from exc
    if not values["sglang_version_basis"].startswith(("stated:", "inferred:")):
        raise _fail(toml_path, "sglang_version_basis: begin with 'stated:' or 'inferred:'")
    if not values["gpu_basis"].startswith(("log:", "thread:", "inferred:")):
        raise _fail(toml_path, "gpu_basis: begin with 'log:', 'thread:' or 'inferred:'")
    for key in ("tp", "dp", "ep", "pp", "nnodes"):
        if values[key] < 1:
            raise _fail(toml_path, f"{key} = {values[key]}: 1 or more")
    if values["weights_total_bytes"] < 0:
        raise _fail(toml_path, "weights_total_bytes: 0 when not found, else the index total_size")
    if values["weights_total_bytes"] > 0 and not values["weights_index_url"]:
        raise _fail(toml_path, "weights_total_bytes given without weights_index_url")
    gpu_total_gib = _get(raw, "gpu_total_gib", float, toml_path)
    if gpu_total_gib <= 0:
        raise _fail(toml_path, "gpu_total_gib: the GPU's total memory in GiB")
    kinds = _get(raw, "kinds", list, toml_path)
    if not kinds or not all(isinstance(k, str) and k in KINDS for k in kinds):
        raise _fail(toml_path, f"kinds {kinds!r}: a non-empty list from {sorted(KINDS)}")
    flags_raw = _get(raw, "flags", dict, toml_path)
    flags = Flags(**{key: _get(flags_raw, key, k, toml_path) for key, k in FLAG_TYPES.items()})
    if flags.speculative_algorithm and "speculative" not in kinds:
        raise _fail(toml_path, "speculative_algorithm is set: add 'speculative' to kinds")
    figures_raw = _get(raw, "figures", dict, toml_path)
    log_path = directory / "log.txt"
    try:
        log = log_path.read_text(encoding="utf-8")
    except OSError as exc:
        raise _fail(log_path, "missing: the verbatim log lines of the start-up") from exc
    # SGLang 0.3.x-0.4.1.post4 printed no "KV Cache is allocated" line; there the
    # "max_total_num_tokens=" line is the sign that the KV pool was allocated.
    if "KV Cache is allocated" not in log and "max_total_num_tokens=" not in log:
        raise _fail(
            log_path,
            "no 'KV Cache is allocated' or 'max_total_num_tokens=' line: only start-ups that "
            "reach the KV pool belong",
        )
    config = _json_object(directory / "config.json", toml_path)
    draft_path = directory / "draft_config.json"
    draft_config = _json_object(draft_path, toml_path) if draft_path.exists() else None
    if (draft_config is None) != (values["draft_config_url"] == ""):
        raise _fail(toml_path, "draft_config.json and draft_config_url go together (or neither)")
    if draft_config is not None:
        draft_config_exact = _get(raw, "draft_config_exact", bool, toml_path)
    elif "draft_config_exact" in raw:
        raise _fail(toml_path, "draft_config_exact without a draft_config.json: remove the key")
    else:
        draft_config_exact = True
    case = Case(
        path=directory,
        retrieved=retrieved,
        gpu_total_gib=gpu_total_gib,
        kinds=tuple(kinds),
        html_unescaped=_get(raw, "html_unescaped", bool, toml_path),
        flags=flags,
        figures=_figures(figures_raw, toml_path),
        graph_passes=_graph_passes(figures_raw.get("graph_passes"), toml_path),
        log=log,
        config=config,
        draft_config=draft_config,
        draft_config_exact=draft_config_exact,
        **values,
    )
    _check_consistency(case, toml_path)
    return case


def case_dirs(root: Path = ROOT) -> list[Path]:
    """Every case directory under ``root``, sorted by name."""
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def load_cases(root: Path = ROOT) -> list[Case]:
    """Every case under ``root``; the first malformed one raises ``CaseError``."""
    return [load_case(d) for d in case_dirs(root)]


_NUMBER = re.compile(r"(?<![\w.])(-?)(\d+(?:\.\d+)?)")


def log_numbers(log: str) -> set[Decimal]:
    """Every number printed in the log, as exact decimals (``12.00`` and ``12.0`` are equal).

    A number printed with a minus sign (``mem usage=-0.14 GB``) is in the set with its sign and
    without it (the ``-`` may be a separator, as in ``2025-08-11``).
    """
    numbers = set()
    for sign, digits in _NUMBER.findall(log):
        numbers.add(Decimal(digits))
        if sign:
            numbers.add(-Decimal(digits))
    return numbers


def figures_not_in_log(case: Case) -> list[str]:
    """Figures (and graph-pass figures) whose number the log does not print anywhere."""
    printed = log_numbers(case.log)
    missing = [
        f"{key} = {value}"
        for key, value in case.figures.items()
        if Decimal(str(value)) not in printed
    ]
    for i, graph in enumerate(case.graph_passes):
        for key in PASS_KEYS:
            value = getattr(graph, key)
            if value is not None and Decimal(str(value)) not in printed:
                missing.append(f"graph_passes[{i}].{key} = {value}")
    return missing

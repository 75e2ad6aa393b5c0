"""The facts the memory estimate needs, read on a server's host over its Transport.

Reads, bounded: the model's ``config.json`` (at most :data:`MAX_CONFIG` bytes), its
``model.safetensors.index.json`` (at most :data:`MAX_INDEX` bytes; ``metadata.total_size``), or
else the sizes of its ``*.safetensors`` files; the same for a separate draft model
(``--speculative-draft-model-path`` in ``extra_args``); and ``nvidia-smi``'s totals and use for the
server's GPUs; with LoRA flags (``--lora-paths``, ``--enable-lora``) and ``--max-lora-rank`` or
``--lora-target-modules`` unset, each adapter's ``adapter_config.json`` (at most
:data:`MAX_ADAPTER_CONFIG` bytes, at most :data:`MAX_ADAPTERS` adapters), as SGLang reads them to
size its LoRA pool (:mod:`launcher.sglang.lora`). The arithmetic is
:mod:`launcher.memory.estimate`'s.

A model, draft or adapter given as a Hugging Face Hub id (``org/name``, which SGLang fetches
through transformers when no such directory exists: 0.5.23 ``get_config``,
``srt/utils/hf_transformers/config.py:336``) is read from the host's Hugging Face cache,
where SGLang's download puts it (``huggingface_hub``'s layout:
``<cache>/models--org--name/refs/<revision>`` holds the commit, ``snapshots/<commit>/`` the
files; the cache is ``$HF_HUB_CACHE``, else the older ``$HUGGINGFACE_HUB_CACHE``, else
``$HF_HOME/hub``, else ``${XDG_CACHE_HOME:-~/.cache}/huggingface/hub``, each the server's
``env`` over the host's). A path of that shape that is a directory on the host (relative to
``$HOME``, where the server starts) is that directory, as SGLang looks for a directory first.
A Hub id not downloaded yet is a NoEstimate saying so.

Error handling: a missing, unreadable or malformed file, or an unusable nvidia-smi answer, is a
:class:`~launcher.sglang.modelfacts.NoEstimate` ("no estimate: <why>"), never a crash; an
unreachable host stays :class:`~launcher.errors.HostUnreachable` (transient, the caller decides).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from typing import Any

import anyio

from launcher.config.schema import HostConfig, ServerConfig
from launcher.errors import LogFormatError, RemoteCommandError
from launcher.host.gpus import query_gpus
from launcher.host.transport.base import CommandResult, Transport
from launcher.memory.estimate import Estimate, estimate
from launcher.memory.priors import DEFAULT_COEFFICIENTS, Coefficients
from launcher.params import LaunchParams
from launcher.sglang.flags import full_flag
from launcher.sglang.lora import (
    LoraAdapter,
    LoraShape,
    adapter_shape,
    parse_lora_flags,
    resolve_lora,
)
from launcher.sglang.modelfacts import (
    GpuFacts,
    ModelFacts,
    NoEstimate,
    ServerShape,
    SpecShape,
    WeightFacts,
    dtype_bytes,
    weight_bytes_from_index,
)

__all__ = [
    "MAX_ADAPTERS",
    "MAX_ADAPTER_CONFIG",
    "MAX_CONFIG",
    "MAX_INDEX",
    "Facts",
    "GpuReadsOnce",
    "read_adapter",
    "read_facts",
    "read_gpus",
    "read_lora",
    "read_model",
    "server_shape",
]

MAX_CONFIG = 1 << 20  # a config.json is a few KiB
MAX_INDEX = 24 << 20  # the largest index.json (a 1T-parameter MoE) is a few MiB
MAX_ADAPTER_CONFIG = 1 << 20  # a PEFT adapter_config.json is about 1 KiB
MAX_ADAPTERS = 64  # adapter configs read per server; more: set the LoRA shape flags
_LORA_FIX = "set --max-lora-rank and --lora-target-modules in the server's extra_args"

# Speculative defaults SGLang picks when the shape is unset (speculative_hook
# ``_auto_choose_speculative_params``): (steps, topk, draft tokens).
_SPEC_AUTO = (3, 1, 4)
_SPEC_AUTO_LLAMA = (5, 4, 8)
_SPEC_EAGLE = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE")

# `cat` of at most $2 bytes of $1; exit 3 when the file is missing, 4 when it is larger.
_READ = (
    'f="$1"; case "$f" in "~/"*) f="$HOME/${f#"~/"}";; esac; '
    '[ -f "$f" ] || exit 3; '
    'n=$(wc -c < "$f") || exit 5; [ "$n" -le "$2" ] || exit 4; cat "$f"'
)
# The byte size of each *.safetensors file of directory $1, one per line.
_SIZES = (
    'd="$1"; case "$d" in "~/"*) d="$HOME/${d#"~/"}";; esac; '
    '[ -d "$d" ] || exit 3; for f in "$d"/*.safetensors; do [ -f "$f" ] && wc -c < "$f"; done; true'
)


# The directory to read for model path $6 when it has a Hub id's shape: $6 itself when it is a
# directory (relative to $HOME, where the server starts; SGLang looks for a directory first),
# else the snapshot of Hub repo $1 (models--org--name) at revision $2 in the HF cache, found
# as huggingface_hub finds it in the server's environment (its env over the host's):
# HF_HUB_CACHE ($3, the server's), HUGGINGFACE_HUB_CACHE ($4), HF_HOME/hub ($5), else
# ${XDG_CACHE_HOME:-~/.cache}/huggingface/hub. Exit 3 (and the cache's path) when absent.
_HUB = (
    'p="$6"; case "$p" in /*) ;; *) p="${HOME:-.}/$p";; esac; '
    'if [ -d "$p" ]; then printf %s "$p"; exit 0; fi; '
    'c="$3"; [ -n "$c" ] || c="${HF_HUB_CACHE:-}"; [ -n "$c" ] || c="$4"; '
    '[ -n "$c" ] || c="${HUGGINGFACE_HUB_CACHE:-}"; '
    '[ -n "$c" ] || { [ -n "$5" ] && c="$5/hub"; }; '
    '[ -n "$c" ] || c="${HF_HOME:+$HF_HOME/hub}"; '
    '[ -n "$c" ] || c="${XDG_CACHE_HOME:-$HOME/.cache}/huggingface/hub"; '
    'case "$c" in "~/"*) c="$HOME/${c#"~/"}";; esac; '
    'd="$c/$1"; r="$2"; [ -f "$d/refs/$r" ] && r=$(cat "$d/refs/$r"); '
    '[ -d "$d/snapshots/$r" ] || { printf %s "$c"; exit 3; }; printf %s "$d/snapshots/$r"'
)
# huggingface_hub's repo id rule (validate_repo_id): one "/", parts of [\w.-], no "--" or "..".
_HUB_ID = re.compile(r"(?!.*(--|\.\.))[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")
_REVISION = re.compile(r"[\w.-]{1,100}")


def hub_id(path: str) -> bool:
    """Whether a model path is a Hugging Face Hub id (``org/name``) rather than a directory:
    SGLang fetches such a path from the Hub (into the HF cache) when no such directory exists."""
    return _HUB_ID.fullmatch(path) is not None and not path.endswith((".", "-"))


@dataclass(frozen=True)
class HubCache:
    """Where the server's environment puts the Hugging Face cache ("": the host's default)."""

    hub_cache: str = ""  # HF_HUB_CACHE
    legacy_hub_cache: str = ""  # HUGGINGFACE_HUB_CACHE, the older name (below HF_HUB_CACHE)
    hf_home: str = ""  # HF_HOME

    @classmethod
    def of(cls, server: ServerConfig) -> HubCache:
        env = server.env
        return cls(env.get("HF_HUB_CACHE", ""), env.get("HUGGINGFACE_HUB_CACHE", ""),
                   env.get("HF_HOME", ""))


HOST_HUB = HubCache()  # nothing set by the server: the host's environment decides


async def model_dir(transport: Transport, path: str, *, revision: str = "main",
                    hub: HubCache = HOST_HUB) -> str:
    """The directory to read for the model path ``path``: itself, or for a Hub id (a path of
    that shape that is no directory on the host) its snapshot at ``revision`` (a branch, tag
    or commit) in the host's HF cache. NoEstimate when the Hub id is not downloaded there
    (SGLang downloads it when it starts)."""
    if not hub_id(path):
        return path
    if _REVISION.fullmatch(revision) is None or ".." in revision:
        raise NoEstimate(f"--revision {revision[:100]!r} is not a branch, tag or commit name "
                         "launcher can look up in the Hugging Face cache")
    repo = "models--" + path.replace("/", "--")
    r = await transport.run(["sh", "-c", _HUB, "sh", repo, revision, hub.hub_cache,
                             hub.legacy_hub_cache, hub.hf_home, path], timeout=60.0)
    where = r.stdout.decode("utf-8", "replace").strip()
    if r.exit_status == 3:
        raise NoEstimate(
            f"{path} (a Hugging Face Hub id) at revision {revision} is not in the Hugging Face "
            f"cache on {transport.host_name} ({where[:300]}); SGLang downloads it when it starts. "
            f"fix: download it there first (`huggingface-cli download {path}`), or set the "
            "path to a local directory")
    if not r.ok or not where:
        raise NoEstimate(f"cannot look up {path} in the Hugging Face cache on "
                         f"{transport.host_name} (exit status {r.exit_status})")
    return where


@dataclass(frozen=True)
class Facts:
    """Everything read for one server."""

    model: ModelFacts
    weights: WeightFacts
    gpus: list[GpuFacts]
    shape: ServerShape
    draft: ModelFacts | None = None
    draft_weights: WeightFacts | None = None
    lora: LoraShape | None = None

    def estimate(self, coeffs: Coefficients = DEFAULT_COEFFICIENTS) -> Estimate:
        return estimate(self.model, self.weights, self.gpus, self.shape, draft=self.draft,
                        draft_weights=self.draft_weights, coeffs=coeffs, lora=self.lora)


async def _read(transport: Transport, path: str, limit: int) -> bytes | None:
    """The file's bytes; None when it does not exist. NoEstimate when too large/unreadable."""
    r = await transport.run(["sh", "-c", _READ, "sh", path, str(limit)], timeout=60.0)
    if r.exit_status == 3:
        return None
    if r.exit_status == 4:
        raise NoEstimate(f"{path} is larger than {limit >> 20} MiB")
    if not r.ok:
        raise NoEstimate(f"cannot read {path} on {transport.host_name} "
                         f"(exit status {r.exit_status})")
    return r.stdout


def _json(data: bytes, path: str) -> Any:
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise NoEstimate(f"{path} is not valid JSON ({str(exc)[:120]})") from None


async def read_model(transport: Transport, path: str) -> tuple[ModelFacts, WeightFacts]:
    """``config.json`` and the weight bytes of the model directory ``path`` on the host."""
    base = path.rstrip("/")
    cfg_path = f"{base}/config.json"
    raw = await _read(transport, cfg_path, MAX_CONFIG)
    if raw is None:
        raise NoEstimate(f"{cfg_path} does not exist on {transport.host_name}")
    model = ModelFacts.from_config(_json(raw, cfg_path))
    idx_path = f"{base}/model.safetensors.index.json"
    raw = await _read(transport, idx_path, MAX_INDEX)
    if raw is not None:
        return model, WeightFacts(weight_bytes_from_index(_json(raw, idx_path)), "index")
    r = await transport.run(["sh", "-c", _SIZES, "sh", base], timeout=60.0)
    sizes = [int(x) for x in r.stdout.decode("ascii", "replace").split() if x.isdigit()]
    if not r.ok or not sizes:
        raise NoEstimate(f"{base} has neither model.safetensors.index.json nor *.safetensors "
                         "files")
    return model, WeightFacts(sum(sizes), "files")


async def read_adapter(transport: Transport, adapter: LoraAdapter,
                       hub: HubCache = HOST_HUB) -> tuple[int, frozenset[str] | str]:
    """(rank, target modules) of one LoRA adapter: its directory's ``adapter_config.json`` on
    the host (:func:`launcher.sglang.lora.adapter_shape`). A missing, oversized, unreadable or
    malformed file is a NoEstimate naming the path and the fix. A Hub id is read from the
    host's HF cache (:func:`model_dir`)."""
    try:
        base = await model_dir(transport, adapter.path, hub=hub)
        path = f"{base.rstrip('/')}/adapter_config.json"
        raw = await _read(transport, path, MAX_ADAPTER_CONFIG)
        if raw is None:
            raise NoEstimate(f"LoRA adapter {adapter.name[:80]!r}: {path[:300]} does not exist "
                             f"on {transport.host_name}")
        return adapter_shape(_json(raw, path), adapter.path)
    except NoEstimate as exc:
        if "--max-lora-rank" in exc.why:  # adapter_shape's own message names the fix
            raise
        raise NoEstimate(f"{exc.why}; fix: {_LORA_FIX}, or give the adapter as a local "
                         "directory") from None


async def read_lora(transport: Transport, server: ServerConfig, version: str,
                    model: ModelFacts, hub: HubCache | None = None) -> LoraShape | None:
    """The LoRA pool's shape of ``server`` (None: LoRA off), reading the adapters' configs
    only where a shape flag is unset."""
    flags = parse_lora_flags(server.extra_args)
    if flags is None:
        return None
    configs = None
    if flags.needs_adapter_configs:
        if len(flags.adapters) > MAX_ADAPTERS:
            raise NoEstimate(f"{len(flags.adapters)} LoRA adapters, launcher reads at most "
                             f"{MAX_ADAPTERS} adapter configs; fix: {_LORA_FIX}")
        h = hub or HubCache.of(server)
        configs = [await read_adapter(transport, a, h) for a in flags.adapters]
    return resolve_lora(flags, configs, model, version)


async def read_gpus(transport: Transport, nvidia_smi: Sequence[str],
                    indices: Sequence[int]) -> list[GpuFacts]:
    """Total and used memory of the GPUs ``indices`` (nvidia-smi, MiB → GiB)."""
    try:
        gpus = {g.index: g for g in await query_gpus(transport, nvidia_smi)}
    except (RemoteCommandError, LogFormatError) as exc:
        raise NoEstimate(f"nvidia-smi: {str(exc)[:200]}") from None
    out = []
    for i in indices:
        g = gpus.get(i)
        if g is None or g.total_mib is None:
            raise NoEstimate(f"nvidia-smi on {transport.host_name} does not show GPU {i}'s "
                             "total memory")
        out.append(GpuFacts(i, g.total_mib / 1024, (g.used_mib or 0) / 1024))
    return out


class GpuReadsOnce:
    """A Transport for one host's first-attempt estimates that runs each distinct nvidia-smi
    query (an argv starting with ``nvidia_smi``) once and answers every later identical
    query with the same :class:`CommandResult` (exit status and output, failed or not).

    Every other call goes to ``inner`` as it is. Concurrent identical queries wait for the
    first (one lock per argv). A query that raises (host unreachable, timeout) is not
    remembered: the next caller runs it again, so errors reach each caller as they did
    without the wrapper. Meant for the estimates made before any launch (the GPUs' use does
    not change between them); the supervisor's preflight keeps reading nvidia-smi itself.
    ``aclose`` does not close ``inner`` (its owner does).
    """

    def __init__(self, inner: Transport, nvidia_smi: Sequence[str]) -> None:
        self.inner = inner
        self._prefix = list(nvidia_smi)
        self._results: dict[tuple[str, ...], CommandResult] = {}
        self._locks: dict[tuple[str, ...], anyio.Lock] = {}
        self.queries = 0  # nvidia-smi commands actually run (for tests and benchmarks)

    @property
    def host_name(self) -> str:
        return self.inner.host_name

    async def run(self, argv: Sequence[str], *, stdin: bytes | None = None,
                  env: Mapping[str, str] | None = None, timeout: float | None = 30.0,
                  check: bool = False) -> CommandResult:
        n = len(self._prefix)
        if (not n or list(argv[:n]) != self._prefix or stdin is not None or env is not None
                or check):
            return await self.inner.run(argv, stdin=stdin, env=env, timeout=timeout,
                                        check=check)
        key = tuple(argv)
        lock = self._locks.setdefault(key, anyio.Lock())
        async with lock:
            cached = self._results.get(key)
            if cached is None:
                self.queries += 1
                cached = await self.inner.run(argv, timeout=timeout)
                self._results[key] = cached
            return cached

    def stream(self, argv: Sequence[str], *,
               env: Mapping[str, str] | None = None) -> AsyncIterator[bytes]:
        return self.inner.stream(argv, env=env)

    def forward_port(self, remote_port: int, address: str,
                     ) -> AbstractAsyncContextManager[tuple[str, int]]:
        return self.inner.forward_port(remote_port, address)

    async def aclose(self) -> None:
        """Nothing: ``inner`` belongs to the caller."""


# The flags the estimate reads from a server's extra_args (abbreviations resolve to them).
_READ_FLAGS = (
    "--speculative-algorithm", "--speculative-num-steps", "--speculative-eagle-topk",
    "--speculative-num-draft-tokens", "--speculative-draft-model-path",
    "--speculative-draft-model", "--speculative-draft-model-revision", "--kv-cache-dtype",
    "--context-length", "--chunked-prefill-size", "--max-running-requests",
    "--disable-overlap-schedule", "--disable-cuda-graph", "--attention-backend",
    "--mamba-ssm-dtype", "--revision",
)


def _flags(argv: Sequence[str]) -> dict[str, str]:
    """``--name value`` / ``--name=value`` / bare ``--name`` ("") of an argv; an abbreviation
    of a flag the estimate reads under that flag's full name."""
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            name, eq, value = a.partition("=")
            name = full_flag(name, _READ_FLAGS)
            if eq:
                out[name] = value
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out[name] = argv[i + 1]
                i += 1
            else:
                out[name] = ""
        i += 1
    return out


def _num(flags: dict[str, str], *names: str) -> int | None:
    for n in names:
        v = flags.get(n, "").lower().replace("k", "000")
        if v.isdigit():
            return int(v)
    return None


def server_shape(server: ServerConfig, version: str, params: LaunchParams,
                 model: ModelFacts) -> tuple[ServerShape, str | None]:
    """The server's shape from its config and ``extra_args``, as SGLang resolves it
    (speculative auto shape; draft tokens = steps + 1 with topk 1), and the draft model path
    (None: the checkpoint's own MTP layers, or no speculative decoding)."""
    f = _flags(server.extra_args)
    spec: SpecShape | None = None
    draft_path: str | None = None
    algo = f.get("--speculative-algorithm", "").upper()
    if algo in _SPEC_EAGLE:
        steps = _num(f, "--speculative-num-steps")
        topk = _num(f, "--speculative-eagle-topk")
        tokens = _num(f, "--speculative-num-draft-tokens")
        if steps is None:
            auto = (_SPEC_AUTO_LLAMA if model.arch in ("LlamaForCausalLM", "Grok1ForCausalLM")
                    else _SPEC_AUTO)
            steps, topk, tokens = auto
        topk = topk or 1
        if topk == 1 or tokens is None:
            tokens = steps + 1
        spec = SpecShape("EAGLE" if algo == "NEXTN" else algo, steps, topk, tokens)
        path = f.get("--speculative-draft-model-path") or f.get("--speculative-draft-model")
        if path and path.rstrip("/") != server.model_path.rstrip("/"):
            draft_path = path
    shape = ServerShape(
        tp=server.tp,
        sglang_version=version,
        kv_cache_dtype=f.get("--kv-cache-dtype", "auto") or "auto",
        context_len=_num(f, "--context-length"),
        chunked_prefill_size=_num(f, "--chunked-prefill-size"),
        max_running_requests=params.max_running_requests or _num(f, "--max-running-requests"),
        spec=spec,
        overlap="--disable-overlap-schedule" not in f and not params.disable_overlap_schedule,
        mamba_full_memory_ratio=params.mamba_full_memory_ratio or 0.9,
        disable_cuda_graph="--disable-cuda-graph" in f,
        attention_backend=f.get("--attention-backend") or None,
    )
    return shape, draft_path


async def read_facts(transport: Transport, host: HostConfig, server: ServerConfig,
                     version: str, params: LaunchParams | None = None) -> Facts:
    """Read every fact for ``server`` on its host. Raises NoEstimate."""
    p = params or server.launch_params()
    f = _flags(server.extra_args)
    hub = HubCache.of(server)
    path = await model_dir(transport, server.model_path, revision=f.get("--revision") or "main",
                           hub=hub)
    model, weights = await read_model(transport, path)
    ssm = f.get("--mamba-ssm-dtype")
    if ssm and model.hybrid is not None:  # --mamba-ssm-dtype overrides config.json's
        model = replace(model, hybrid=replace(model.hybrid, ssm_dtype_bytes=dtype_bytes(ssm, 4)))
    shape, draft_path = server_shape(server, version, p, model)
    draft = draft_weights = None
    if draft_path is not None:
        revision = f.get("--speculative-draft-model-revision") or "main"
        draft, draft_weights = await read_model(
            transport, await model_dir(transport, draft_path, revision=revision, hub=hub))
    lora = await read_lora(transport, server, version, model, hub)
    gpus = await read_gpus(transport, host.nvidia_smi, server.gpus)  # every replica's GPUs
    return Facts(model, weights, gpus, shape, draft, draft_weights, lora)

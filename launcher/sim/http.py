"""The simulated server's HTTP API (stdlib ``http.server``, one thread per request).

Endpoints follow SGLang's ``python/sglang/srt/entrypoints/http_server.py`` (0.5.23: ``/health``
and ``/health_generate`` l.721-723, ``/ready`` l.714, ``/ping`` l.2190; 0.5.10: l.476, l.1679):

    GET  /health, /health_generate   503 while starting, hung or shutting down; 200 when up
    GET  /ready (>= 0.5.23)          200 iff up
    GET  /ping                       0.5.23: 200 iff up; older: always 200
    GET  /model_info, /get_model_info, /v1/models, /server_info, /get_server_info
    GET  /metrics                    only with --enable-metrics (else 404)
    POST /generate                   a tiny fake completion
    POST /v1/chat/completions        the same completion in the OpenAI chat shape
    POST /freeze_gc                  200 (the 0.5.23 warmup posts it)

With an API key every path except ``/health*``, ``/metrics`` (and ``/ready`` on 0.5.23) needs
``Authorization: Bearer KEY``. Each request is reported to the backend for uvicorn's access log.

Not SGLang: each answer names the simulated server that produced it (``host:port`` it listens
on) as ``meta_info.sim_served_by`` (``/generate``) or ``metadata.sim_served_by`` (chat), so a
test can tell where a router sent a request.
"""

from __future__ import annotations

import contextlib
import enum
import http
import json
import socket
import threading
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import urlsplit

from launcher.sglang.versions import at_least


class SimServerState(enum.StrEnum):
    STARTING = "starting"  # bound, warmup not done
    UP = "up"
    UNHEALTHY = "unhealthy"  # a health check found the scheduler hung
    SHUTTING_DOWN = "shutting_down"


@dataclass(frozen=True)
class ApiInfo:
    """What the read-only endpoints report about a server that finished loading."""

    version: str  # the emulated SGLang version
    model_path: str
    served_model_name: str
    model_type: str
    arch: str
    load_format: str
    context_len: int
    server_args: Sequence[tuple[str, Any]]  # resolved, in the server_args dump's order
    max_total_num_tokens: int
    weights_gib: float  # per rank
    kv_cache_gib: float
    graph_gib: float

    @property
    def extended(self) -> bool:
        """0.5.23 adds fields to /model_info."""
        return at_least(self.version, (0, 5, 23))


def model_info_body(info: ApiInfo) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model_path": info.model_path,
        "tokenizer_path": info.model_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": info.model_type,
        "architectures": [info.arch],
    }
    if info.extended:
        body.update(
            served_model_name=info.served_model_name,
            load_format=info.load_format,
            reasoning_parser=None,
            tool_call_parser=None,
            disaggregation_mode="null",
        )
    return body


def models_body(info: ApiInfo) -> dict[str, Any]:
    name = info.served_model_name
    model = {
        "id": name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "sglang",
        "root": name,
        "parent": None,
        "max_model_len": info.context_len,
    }
    return {"object": "list", "data": [model]}


def server_info_body(info: ApiInfo) -> dict[str, Any]:
    """Resolved server args, scheduler info and per-DP internal states, like SGLang's."""
    body: dict[str, Any] = dict(info.server_args)
    body.update(
        max_total_num_tokens=info.max_total_num_tokens,
        max_req_input_len=info.context_len - 1,
        internal_states=[
            {
                "last_gen_throughput": 0.0,
                "memory_usage": {
                    "weight": round(info.weights_gib, 2),
                    "kvcache": round(info.kv_cache_gib, 2),
                    "token_capacity": info.max_total_num_tokens,
                    "graph": round(info.graph_gib, 2),
                },
            }
        ],
        version=info.version,
    )
    return body


def metrics_body(info: ApiInfo, running: int) -> str:
    """A few of SGLang's Prometheus gauges."""
    labels = f'{{model_name="{info.served_model_name}"}}'
    rows = [
        ("sglang:num_running_reqs", "The number of running requests.", running),
        ("sglang:num_queue_reqs", "The number of requests in the waiting queue.", 0),
        ("sglang:token_usage", "The token usage.", 0),
        (
            "sglang:max_total_num_tokens",
            "Maximum total number of tokens.",
            info.max_total_num_tokens,
        ),
    ]
    out = []
    for name, help_text, value in rows:
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name}{labels} {value:.1f}"]
    return "\n".join(out) + "\n"


class HttpBackend(Protocol):
    """What the HTTP layer needs from the simulated server."""

    api_key: str | None
    enable_metrics: bool
    strict_probes: bool  # 0.5.23: /ready exists and /ping follows health

    def status(self) -> SimServerState: ...

    def health(self) -> int:
        """Status code of /health (may mark the server unhealthy)."""
        ...

    def info(self) -> ApiInfo: ...

    def scheduler_round_trip(self) -> None:
        """Returns when the scheduler answers; blocks for ever when it is hung."""
        ...

    def running_requests(self) -> int: ...

    def generate(self, request: dict[str, Any]) -> dict[str, Any]:
        """May block for ever, or end the process, as the simulated scheduler does."""
        ...

    def deprecated_path(self, path: str, replacement: str) -> None: ...

    def access(self, client: str, request_line: str, code: int) -> None: ...


_OPEN_PATHS = frozenset({"/health", "/health_generate", "/metrics"})


class SimHttpServer(ThreadingHTTPServer):
    """Binds at construction (raises OSError like uvicorn's bind when the port is taken)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], backend: HttpBackend) -> None:
        self.backend = backend
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="http", daemon=True)
        thread.start()
        return thread


class _Handler(BaseHTTPRequestHandler):
    server: SimHttpServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return  # the backend writes uvicorn-style access lines instead

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        backend = self.server.backend
        path = urlsplit(self.path).path
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        code, payload, ctype = self._route(backend, method, path, body)
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
        client = f"{self.client_address[0]}:{self.client_address[1]}"
        backend.access(client, f"{method} {self.path} {self.request_version}", code)

    def _authorized(self, backend: HttpBackend, path: str) -> bool:
        if not backend.api_key or path in _OPEN_PATHS:
            return True
        if path == "/ready" and backend.strict_probes:
            return True
        return self.headers.get("Authorization") == f"Bearer {backend.api_key}"

    def _route(
        self, backend: HttpBackend, method: str, path: str, body: bytes
    ) -> tuple[int, bytes, str]:
        if not self._authorized(backend, path):
            return _json(401, {"error": "Unauthorized"})
        if method == "GET":
            return self._get(backend, path)
        if path in ("/generate", "/v1/chat/completions"):
            try:
                request = json.loads(body or b"{}")
            except ValueError:
                return _json(400, {"error": {"message": "invalid JSON body"}})
            if not isinstance(request, dict):
                return _json(400, {"error": {"message": "body must be a JSON object"}})
            host, port = self.server.server_address[:2]
            served_by = f"{host!s}:{port}" if isinstance(host, str) else f"{host!r}:{port}"
            if path == "/v1/chat/completions":
                return _json(200, chat_completion(backend, request, served_by))
            answer = backend.generate(request)
            answer.setdefault("meta_info", {})["sim_served_by"] = served_by
            return _json(200, answer)
        if path == "/freeze_gc":
            return _json(200, {})
        return _not_found()

    def _get(self, backend: HttpBackend, path: str) -> tuple[int, bytes, str]:
        status = backend.status()
        if path in ("/health", "/health_generate"):
            return backend.health(), b"", "text/plain"
        if path == "/ready" and backend.strict_probes:
            return (200 if status is SimServerState.UP else 503), b"", "text/plain"
        if path == "/ping":
            ok = status is SimServerState.UP or not backend.strict_probes
            return (200 if ok else 503), b"", "text/plain"
        if path in ("/model_info", "/get_model_info"):
            if path == "/get_model_info":
                backend.deprecated_path(path, "/model_info")
            return _json(200, model_info_body(backend.info()))
        if path == "/v1/models":
            return _json(200, models_body(backend.info()))
        if path in ("/server_info", "/get_server_info"):
            if path == "/get_server_info":
                backend.deprecated_path(path, "/server_info")
            backend.scheduler_round_trip()
            return _json(200, server_info_body(backend.info()))
        if path == "/metrics" and backend.enable_metrics:
            text = metrics_body(backend.info(), backend.running_requests())
            return 200, text.encode(), "text/plain; version=0.0.4"
        return _not_found()


def chat_completion(backend: HttpBackend, request: dict[str, Any], served_by: str,
                    ) -> dict[str, Any]:
    """SGLang's non-streaming ``ChatCompletionResponse`` for the last user message, made by
    ``backend.generate`` (serving_chat.py: id from meta_info, ``metadata`` with the weight
    version)."""
    messages = request.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else {}
    text = last.get("content") if isinstance(last, dict) else ""
    max_new = request.get("max_tokens") or request.get("max_completion_tokens") or 8
    out = backend.generate({"text": text if isinstance(text, str) else "",
                            "sampling_params": {"max_new_tokens": int(max_new)}})
    meta = out.get("meta_info", {})
    prompt, completion = int(meta.get("prompt_tokens", 0)), int(meta.get("completion_tokens", 0))
    return {
        "id": str(meta.get("id", "")),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.get("model") or backend.info().served_model_name,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": str(out.get("text", "")).strip(),
                        "reasoning_content": None, "tool_calls": None},
            "logprobs": None,
            "finish_reason": "length",
            "matched_stop": None,
        }],
        "usage": {"prompt_tokens": prompt, "total_tokens": prompt + completion,
                  "completion_tokens": completion, "prompt_tokens_details": None,
                  "reasoning_tokens": 0},
        "metadata": {"weight_version": "default", "sim_served_by": served_by},
    }


def _json(code: int, data: dict[str, Any]) -> tuple[int, bytes, str]:
    return code, json.dumps(data).encode(), "application/json"


def _not_found() -> tuple[int, bytes, str]:
    return _json(404, {"detail": "Not Found"})


def reason(code: int) -> str:
    """``OK``, ``Service Unavailable``... for an access-log line."""
    try:
        return http.HTTPStatus(code).phrase
    except ValueError:
        return ""


# ---------------------------------------------------------------------------------------------
# The warmup client


class WarmupEnd(enum.Enum):
    READY = "ready"  # the warmup request succeeded
    FAILED = "failed"  # SGLang logs "Initialization failed. warmup error: ..." and dies
    STOPPED = "stopped"  # uvicorn is shutting down (its bind failed) and an attempt failed


WARMUP_PROMPT = {
    "text": "The capital city of France is",
    "sampling_params": {"temperature": 0, "max_new_tokens": 8},
}


def request(
    method: str, url: str, body: dict[str, Any] | None, *, api_key: str | None, timeout: float
) -> tuple[int, str]:
    """One HTTP request as ``requests`` makes it (environment proxies honoured)."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return int(resp.status), resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace")


def run_warmup(
    base_url: str,
    *,
    model_info_path: str,
    api_key: str | None,
    poll_s: float,
    generate_timeout_s: float,
    freeze_gc: bool,
    stop: threading.Event,
) -> tuple[WarmupEnd, str]:
    """SGLang's ``_wait_and_warmup``: poll the model-info path (every ``poll_s``, 120 tries),
    then one ``POST /generate``; 0.5.23 then posts /freeze_gc. Returns how it ended and, when
    it failed, the error text SGLang logs. Once ``stop`` is set, a failed attempt ends it."""
    last = ""
    for _ in range(120):
        time.sleep(poll_s)
        try:
            code, _ = request("GET", base_url + model_info_path, None, api_key=api_key, timeout=5)
            if code == 200:
                break
            last = f"GET {model_info_path} returned {code}"
        except Exception:
            last = traceback.format_exc()
        if stop.is_set():
            return WarmupEnd.STOPPED, last
    else:
        return WarmupEnd.FAILED, last
    try:
        code, text = request(
            "POST", base_url + "/generate", WARMUP_PROMPT, api_key=api_key,
            timeout=generate_timeout_s,
        )  # fmt: skip
        if code != 200:
            raise AssertionError(f"res=<Response [{code}]>, res.text={text!r}")
    except Exception:
        return (WarmupEnd.STOPPED if stop.is_set() else WarmupEnd.FAILED), traceback.format_exc()
    if freeze_gc:
        with contextlib.suppress(Exception):
            request("POST", base_url + "/freeze_gc", {}, api_key=api_key, timeout=5)
    return WarmupEnd.READY, ""

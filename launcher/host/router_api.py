"""The SGLang router's worker API, as a client: register, deregister and list workers.

The router (``sglang-router`` 0.3.x, the SGLang Model Gateway, ``smg``) runs on a remote host;
its HTTP API is reached through the host's transport the way the health probes reach a server
(``health.client_for``: an SSH forward to a Unix socket, or the port itself locally).

Two dialects, told apart by the router itself:

- current: ``POST /workers {"url": ...}`` answers 202 and queues the registration (the router
  then checks the worker's ``/health``, ``/model_info`` and ``/server_info`` in the
  background); ``GET /workers`` lists ``{"workers": [{"id", "url", "is_healthy", ...}]}``;
  ``DELETE /workers/{id}`` answers 202 and queues the removal. Both are asynchronous, so each
  is confirmed by listing until the worker appears (or is gone).
- legacy (sgl-router up to about 0.2): ``POST /add_worker?url=``, ``POST /remove_worker?url=``
  and ``GET /list_workers`` (``{"urls": [...]}``), used when ``/workers`` answers 404 or 405.

Answers are read bounded (``MAX_ANSWER`` raw bytes, ``Accept-Encoding: identity``, never
decompressed): a router that answers a gigabyte, or a small gzip body that inflates to one,
costs launcher at most that much memory, and the call fails with ``RouterApiError``.

With an API key (``[[routers]] api_key``) every call carries ``Authorization: Bearer KEY``.

Error handling: the transient failures named in ``TRANSIENT`` (a connection refused, reset or
timed out, the host unreachable, 502/503/504 from the router) are retried a bounded number of
times with jittered exponential backoff; anything else raises ``RouterApiError`` at once.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import httpx
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from launcher.errors import HostUnreachable, LauncherError

# Router answers that mean "not now" rather than "no": its proxy or its own start-up.
_T = TypeVar("_T")
_RETRY_STATUS = frozenset({502, 503, 504})
_LEGACY_STATUS = frozenset({404, 405})
# Raw bytes read of one answer: a listing of thousands of workers is well under 1 MiB.
MAX_ANSWER = 4 << 20
_SHOWN = 300  # characters of a refusal's body quoted in an error


class RouterApiError(LauncherError):
    """The router refused or mangled a worker API call (not retried)."""


class RouterBusy(RouterApiError):
    """The router answered 502, 503 or 504 (retried: it may be starting or overloaded)."""


class RegistrationPending(RouterApiError):
    """An asynchronous registration or removal was not visible in the listing in time."""


TRANSIENT: tuple[type[BaseException], ...] = (
    httpx.TransportError, HostUnreachable, RouterBusy, TimeoutError,
)


def is_transient(exc: BaseException) -> bool:
    return isinstance(exc, TRANSIENT)


@dataclass(frozen=True)
class Worker:
    """One worker as the router lists it (``id`` is empty for a legacy router)."""

    url: str
    id: str
    healthy: bool | None


def normalize(url: str) -> str:
    return url.rstrip("/")


class RouterClient:
    """The worker API of one router, over an httpx client already bound to it.

    ``base`` is the router's URL as that client reaches it (``http://localhost`` over a Unix
    socket forward). ``sleep`` is injected so tests control the confirmation polls.
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        base: str,
        *,
        tries: int = 4,
        confirm_s: float = 30.0,
        poll_s: float = 0.1,
        sleep: Callable[[float], Any] = anyio.sleep,
        api_key: str | None = None,
        max_answer: int = MAX_ANSWER,
    ) -> None:
        self.client = client
        self.base = base.rstrip("/")
        self.tries = tries
        self.confirm_s = confirm_s
        self.poll_s = poll_s
        self.sleep = sleep
        self.legacy: bool | None = None  # None until the router has told
        self.max_answer = max_answer
        # identity: a compressed answer would be inflated past any cap on what was read.
        self._headers = {"Accept-Encoding": "identity"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"

    # -- public ------------------------------------------------------------------------

    async def workers(self) -> dict[str, Worker]:
        """The router's workers by normalized URL."""
        return await self._retrying(self._list)

    async def register(self, url: str) -> Worker:
        """Add ``url`` as a worker and return it once the router lists it.

        Idempotent: a worker already listed is returned as it is (the router keys workers by
        URL, so a second POST would queue a no-op job).
        """
        url = normalize(url)
        listed = await self.workers()
        if url in listed:
            return listed[url]
        await self._retrying(lambda: self._add(url))
        return await self._confirm(url, present=True)

    async def deregister(self, url: str) -> bool:
        """Remove ``url``; True when it was listed (and is gone now), False when it was not."""
        url = normalize(url)
        listed = await self.workers()
        worker = listed.get(url)
        if worker is None:
            return False
        await self._retrying(lambda: self._remove(worker))
        await self._confirm(url, present=False)
        return True

    # -- calls -------------------------------------------------------------------------

    async def _retrying(self, call: Callable[[], Awaitable[_T]]) -> _T:
        retrying = AsyncRetrying(
            retry=retry_if_exception(is_transient),
            stop=stop_after_attempt(self.tries),
            wait=wait_exponential_jitter(multiplier=0.1, max=2.0, jitter=0.2),
            sleep=self.sleep,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await call()
        raise AssertionError("unreachable")  # pragma: no cover (reraise=True)

    async def _request(self, method: str, path: str, **kwargs: Any) -> _Answer:
        """One call; its answer's raw body read up to ``max_answer`` bytes (more fails)."""
        async with self.client.stream(method, self.base + path, headers=self._headers,
                                      **kwargs) as resp:
            if resp.status_code in _RETRY_STATUS:
                raise RouterBusy(f"router answered {method} {path} with {resp.status_code}")
            body = bytearray()
            async for chunk in resp.aiter_raw():
                body += chunk
                if len(body) > self.max_answer:
                    raise RouterApiError(
                        f"{method} {path}: the router's answer is larger than "
                        f"{self.max_answer} bytes (not read further)",
                        remedy="check that the router's port is the router's")
            encoding = resp.headers.get("Content-Encoding", "identity").strip().lower()
            return _Answer(resp.status_code, bytes(body), encoding)

    async def _list(self) -> dict[str, Worker]:
        if self.legacy is not True:
            resp = await self._request("GET", "/workers")
            if resp.status_code not in _LEGACY_STATUS:
                self.legacy = False
                body = _json(resp, "GET /workers")
                found: dict[str, Worker] = {}
                for item in body.get("workers") or []:
                    if isinstance(item, dict) and isinstance(item.get("url"), str):
                        healthy = item.get("is_healthy")
                        found[normalize(item["url"])] = Worker(
                            normalize(item["url"]), str(item.get("id") or ""),
                            healthy if isinstance(healthy, bool) else None)
                return found
            self.legacy = True
        resp = await self._request("GET", "/list_workers")
        body = _json(resp, "GET /list_workers")
        urls = body.get("urls") or []
        return {normalize(u): Worker(normalize(u), "", None) for u in urls if isinstance(u, str)}

    async def _add(self, url: str) -> None:
        if self.legacy is not True:
            resp = await self._request("POST", "/workers", json={"url": url})
            if resp.status_code in (200, 201, 202):
                self.legacy = False
                return
            if resp.status_code not in _LEGACY_STATUS:
                raise RouterApiError(_refused("POST /workers", resp))
            self.legacy = True
        resp = await self._request("POST", "/add_worker", params={"url": url})
        if resp.status_code != 200:
            raise RouterApiError(_refused("POST /add_worker", resp))

    async def _remove(self, worker: Worker) -> None:
        if not self.legacy and worker.id:
            resp = await self._request("DELETE", f"/workers/{worker.id}")
            if resp.status_code in (200, 202, 204, 404):  # 404: removed meanwhile
                return
            if resp.status_code != 405:
                raise RouterApiError(_refused(f"DELETE /workers/{worker.id}", resp))
        resp = await self._request("POST", "/remove_worker", params={"url": worker.url})
        if resp.status_code not in (200, 404):
            raise RouterApiError(_refused("POST /remove_worker", resp))

    async def _confirm(self, url: str, *, present: bool) -> Worker:
        """Poll the listing until ``url`` is (or is no longer) in it, for ``confirm_s``."""
        waited = 0.0
        while True:
            listed = await self.workers()
            if (url in listed) == present:
                return listed.get(url) or Worker(url, "", None)
            if waited >= self.confirm_s:
                what = "registration" if present else "removal"
                raise RegistrationPending(
                    f"the router accepted the {what} of {url} but did not list it as "
                    f"{'added' if present else 'removed'} within {self.confirm_s:g}s",
                    remedy="check the router's log (a worker it cannot reach is never added)",
                )
            await self.sleep(self.poll_s)
            waited += self.poll_s


@dataclass(frozen=True)
class _Answer:
    """An answer as read: its status, its raw body (at most ``max_answer`` bytes) and the
    ``Content-Encoding`` it claims (a compressed body is refused, never inflated)."""

    status_code: int
    body: bytes
    encoding: str

    @property
    def text(self) -> str:
        return self.body[:_SHOWN * 4].decode("utf-8", "replace")


def _json(resp: _Answer, what: str) -> dict[str, Any]:
    if resp.status_code != 200:
        raise RouterApiError(_refused(what, resp))
    if resp.encoding not in ("", "identity"):
        raise RouterApiError(f"{what}: the router's answer is {resp.encoding}-encoded "
                             "although launcher asked for identity (not decoded)")
    try:
        body = json.loads(resp.body)
    except ValueError:
        raise RouterApiError(f"{what}: the router's answer is not JSON") from None
    if not isinstance(body, dict):
        raise RouterApiError(f"{what}: the router's answer is not a JSON object")
    return body


def _refused(what: str, resp: _Answer) -> str:
    if resp.encoding not in ("", "identity"):
        return f"{what}: the router answered {resp.status_code} ({resp.encoding}-encoded body)"
    hint = ("; the router wants an API key: set this router's api_key"
            if resp.status_code == 401 else "")
    return f"{what}: the router answered {resp.status_code}: {resp.text[:_SHOWN]}{hint}"

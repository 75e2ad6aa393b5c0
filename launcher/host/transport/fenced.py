"""A transport that refuses every command once this launcher's lease is gone.

With ``[coordination]`` the daemon wraps each host's transport in :class:`FencedTransport`,
so that no code path (launch, stop, relaunch, a router's worker registration, a give-up
mark) can reach a host without the fence check right before it: the check sits at the one
door every host action goes through. Reads are refused too: a launcher that lost its lease
has no business on any host. The inner transport's optional capabilities (``duplex``,
``connect_port``, ``forward_unix``) are passed on, checked the same way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from launcher.host.transport.base import CommandResult, Transport
from launcher.store.fence import Fence

__all__ = ["FencedTransport", "fence_of"]

_OPTIONAL_CONTEXTS = ("duplex", "forward_unix")
_OPTIONAL_CALLS = ("connect_port",)


class FencedTransport:
    """``inner`` behind ``fence``: every command, stream, forward or channel first checks it
    (LeaseLost when it is not valid). ``aclose`` is never refused (it kills nothing)."""

    def __init__(self, inner: Transport, fence: Fence) -> None:
        self.inner = inner
        self.fence = fence

    @property
    def host_name(self) -> str:
        return self.inner.host_name

    async def run(self, argv: Sequence[str], *, stdin: bytes | None = None,
                  env: Mapping[str, str] | None = None, timeout: float | None = 30.0,
                  check: bool = False) -> CommandResult:
        self.fence.check(f"a command on {self.inner.host_name}")
        return await self.inner.run(argv, stdin=stdin, env=env, timeout=timeout, check=check)

    async def stream(self, argv: Sequence[str], *,
                     env: Mapping[str, str] | None = None) -> AsyncIterator[bytes]:
        self.fence.check(f"a command on {self.inner.host_name}")
        iterator = self.inner.stream(argv, env=env)
        try:
            async for chunk in iterator:
                yield chunk
        finally:
            aclose = getattr(iterator, "aclose", None)
            if aclose is not None:
                await aclose()

    def forward_port(self, remote_port: int, address: str,
                     ) -> AbstractAsyncContextManager[tuple[str, int]]:
        return self._checked_context(self.inner.forward_port, "a port forward")(remote_port,
                                                                                 address)

    async def aclose(self) -> None:
        await self.inner.aclose()

    def _checked_context(self, make: Callable[..., AbstractAsyncContextManager[Any]],
                         what: str) -> Callable[..., AbstractAsyncContextManager[Any]]:
        @asynccontextmanager
        async def checked(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            self.fence.check(f"{what} to {self.inner.host_name}")
            async with make(*args, **kwargs) as value:
                yield value
        return checked

    def __getattr__(self, name: str) -> Any:
        # Only the optional capabilities are passed on (AttributeError when the inner
        # transport lacks them, so ``getattr(t, name, None)`` tests keep working).
        if name in _OPTIONAL_CONTEXTS:
            return self._checked_context(getattr(self.inner, name), name)
        if name in _OPTIONAL_CALLS:
            call = getattr(self.inner, name)

            async def checked(*args: Any, **kwargs: Any) -> Any:
                self.fence.check(f"{name} on {self.inner.host_name}")
                return await call(*args, **kwargs)
            return checked
        raise AttributeError(name)


def fence_of(transport: Transport) -> Fence | None:
    """The fence ``transport`` checks, or None (no coordination: one operator box)."""
    fence = getattr(transport, "fence", None)
    return fence if isinstance(fence, Fence) else None

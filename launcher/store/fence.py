"""The fence: whether this launcher may act on hosts now, and the timing rule behind it.

Without ``[coordination]`` there is no fence and every action is allowed (one operator box).
With it, :class:`Fence` holds the lease's fencing token and a deadline on this process's own
monotonic clock; the host layer checks it right before every command it sends
(``launcher.host.transport.fenced``), and launch claims carry the token to the host
(``launcher.host.run``), which refuses a token lower than one it has seen.

The timing rule (:class:`LeaseTiming`, pure; docs/ha.md has the argument): a renewal that
*started* at local time ``t`` and succeeded moves the engine's expiry to at least
``t + ttl`` (the database stamps ``now() + ttl`` after receiving it, by its own clock), so
this launcher stops acting at ``t + ttl - margin``: ``margin`` before any standby can take the
lease (a standby takes it only once the engine's clock passed the expiry). ``margin`` covers
a command already sent when the deadline passed and clock-rate differences.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from launcher.errors import LeaseLost

__all__ = ["Fence", "LeaseTiming"]

Clock = Callable[[], float]


@dataclass(frozen=True)
class LeaseTiming:
    """How long a lease lasts (``ttl``), how early its holder stops acting (``margin``) and
    how often it renews (``renew_every``: ttl/3, so two renewals may fail before the lease
    is given up)."""

    ttl: float
    margin: float

    def __post_init__(self) -> None:
        if not 0 < self.margin < self.ttl - self.renew_every:
            raise ValueError(f"margin {self.margin} must be above 0 and below ttl - ttl/3 "
                             f"({self.ttl - self.renew_every:g}) for ttl {self.ttl}")

    @classmethod
    def for_ttl(cls, ttl: float) -> LeaseTiming:
        """The default margin for ``ttl``: a quarter of it."""
        return cls(ttl=ttl, margin=ttl / 4)

    @property
    def renew_every(self) -> float:
        return self.ttl / 3

    def deadline(self, started_at: float) -> float:
        """When the holder must stop acting, given a successful acquisition or renewal that
        started (was sent) at ``started_at`` on the holder's monotonic clock."""
        return started_at + self.ttl - self.margin

    def try_budget(self, now: float, deadline: float) -> float:
        """How long one renewal try started at ``now`` may take: until the next one is due,
        and never past the deadline (then the lease is lost, whatever the try would say)."""
        return max(0.0, min(self.renew_every, deadline - now))


class Fence:
    """The token of the lease this launcher holds, valid until a deadline on ``clock``.

    ``grant`` sets a newly acquired token; ``extend`` moves the deadline forward after a
    renewal (never back); ``revoke`` ends it at once. ``check`` raises LeaseLost unless the
    fence is valid: the host layer calls it before every command.
    """

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self._token: int | None = None
        self._deadline = -math.inf

    @property
    def token(self) -> int | None:
        """The token held (or last held), None before the first acquisition."""
        return self._token

    @property
    def deadline(self) -> float:
        return self._deadline

    def grant(self, token: int, deadline: float) -> None:
        self._token = token
        self._deadline = deadline

    def extend(self, deadline: float) -> None:
        if self._token is not None:
            self._deadline = max(self._deadline, deadline)

    def revoke(self) -> None:
        self._deadline = -math.inf

    def valid(self) -> bool:
        return self._token is not None and self._clock() < self._deadline

    def check(self, action: str) -> None:
        """Raise LeaseLost naming ``action`` unless this launcher may act now."""
        if not self.valid():
            raise LeaseLost(f"{action} refused: this launcher no longer holds the lease "
                            f"(token {self._token})", token=self._token)

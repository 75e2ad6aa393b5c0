"""How long to wait before relaunching a server that died after it had been ready.

Pure: the caller passes the time (any monotonic clock, in seconds) and does the sleeping.
Delays grow exponentially from ``initial`` up to ``maximum`` with jitter, so a fleet of
servers that died together does not relaunch in lockstep. A server that stays healthy for
``healthy_reset`` seconds starts again from ``initial``. At most ``budget`` restarts are
allowed in any ``window`` seconds; past that ``on_failure`` answers ``None`` and the caller
gives up (a crash loop needs a person, not more restarts).
"""

from __future__ import annotations

import enum
import random
from collections import deque

from launcher.errors import PolicyError


class Jitter(enum.StrEnum):
    """How the capped exponential delay ``d`` is randomised."""

    FULL = "full"  # uniform in [0, d]: spreads best, may restart at once
    EQUAL = "equal"  # d/2 + uniform in [0, d/2]: spreads, and always waits at least d/2
    NONE = "none"  # exactly d


class RestartBackoff:
    """Capped exponential backoff with jitter, a healthy reset and a restart budget.

    ``on_failure(now)`` -> seconds to wait, or ``None`` when the budget is spent.
    ``on_healthy(now)`` -> report the server healthy (call on ready and on each good probe).

    The n-th failure since the last reset waits ``min(maximum, initial * 2**(n-1))`` before
    jitter. ``rng`` draws the jitter; ``None`` uses a private ``random.Random()``.
    Times must not go backwards; ``PolicyError`` says so, and names bad settings.
    """

    def __init__(
        self,
        initial: float,
        maximum: float,
        healthy_reset: float,
        budget: int,
        window: float,
        rng: random.Random | None = None,
        *,
        jitter: Jitter = Jitter.EQUAL,
    ) -> None:
        problems = []
        if not initial > 0:
            problems.append(f"initial ({initial}) must be > 0")
        if not maximum >= initial:
            problems.append(f"maximum ({maximum}) must be >= initial ({initial})")
        if not healthy_reset >= 0:
            problems.append(f"healthy_reset ({healthy_reset}) must be >= 0")
        if budget < 0:
            problems.append(f"budget ({budget}) must be >= 0")
        if not window > 0:
            problems.append(f"window ({window}) must be > 0")
        if problems:
            raise PolicyError(
                "restart backoff: " + "; ".join(problems),
                remedy="fix [policy] restart_backoff_initial / restart_backoff_max / "
                "healthy_reset / restart_budget / restart_window",
            )
        self.initial = initial
        self.maximum = maximum
        self.healthy_reset = healthy_reset
        self.budget = budget
        self.window = window
        self.jitter = jitter
        self._rng = rng if rng is not None else random.Random()
        self._streak = 0  # failures since the last reset
        self._restarts: deque[float] = deque()  # times of granted restarts inside the window
        self._healthy_since: float | None = None
        self._last_now: float | None = None

    @property
    def streak(self) -> int:
        """Failures since the last reset (0 after a long enough healthy run)."""
        return self._streak

    def restarts_in_window(self, now: float) -> int:
        """Restarts granted in the ``window`` seconds up to ``now``."""
        self._tick(now)
        self._expire(now)
        return len(self._restarts)

    def on_healthy(self, now: float) -> None:
        """The server is healthy at ``now``; after ``healthy_reset`` seconds of it, reset."""
        self._tick(now)
        if self._healthy_since is None:
            self._healthy_since = now
        if now - self._healthy_since >= self.healthy_reset:
            self._streak = 0

    def on_failure(self, now: float) -> float | None:
        """The server died at ``now``: seconds to wait before relaunching, or ``None``.

        ``None`` means ``budget`` restarts were already granted within the last ``window``
        seconds; nothing is recorded then, so a later call (after old restarts leave the
        window) may be granted again.
        """
        self._end_healthy_stretch(now)
        self._expire(now)
        if len(self._restarts) >= self.budget:
            return None
        self._restarts.append(now)
        self._streak += 1
        delay = min(self.maximum, self.initial * 2.0 ** min(self._streak - 1, 1023))
        if self.jitter is Jitter.FULL:
            return self._rng.uniform(0.0, delay)
        if self.jitter is Jitter.EQUAL:
            return delay / 2 + self._rng.uniform(0.0, delay / 2)
        return delay

    def reset(self) -> None:
        """Forget the streak and the budget (an operator restarted the server by hand)."""
        self._streak = 0
        self._restarts.clear()
        self._healthy_since = None

    def _end_healthy_stretch(self, now: float) -> None:
        """The healthy stretch ends at ``now``: reset the streak if it lasted long enough."""
        self._tick(now)
        if self._healthy_since is not None and now - self._healthy_since >= self.healthy_reset:
            self._streak = 0
        self._healthy_since = None

    def _expire(self, now: float) -> None:
        while self._restarts and self._restarts[0] <= now - self.window:
            self._restarts.popleft()

    def _tick(self, now: float) -> None:
        if self._last_now is not None and now < self._last_now:
            raise PolicyError(
                f"restart backoff: time went backwards ({now} < {self._last_now})",
                remedy="pass a monotonic clock",
            )
        self._last_now = now

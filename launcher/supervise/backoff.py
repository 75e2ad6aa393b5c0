"""Launcher's one schedule of waits: the restart budget and every doubling wait.

The schedules are pure: the caller passes the time (any monotonic clock, in seconds) and
does the sleeping, with an injected ``Sleeper`` (``sleep_or`` when an event may end the wait
early), so tests run the schedule on a fake clock and sleep. Retries of named
transient errors that are bounded in tries and time go through tenacity instead (see
``docs/architecture.md``, "Backing off"); what is here has no bound but the caller's:

- ``RestartBackoff``: how long to wait before relaunching a server (or a router) that died
  after it had been ready. Delays grow exponentially from ``initial`` up to ``maximum`` with
  jitter, so a fleet of servers that died together does not relaunch in lockstep. A server
  that stays healthy for ``healthy_reset`` seconds starts again from ``initial``. At most
  ``budget`` restarts are allowed in any ``window`` seconds; past that ``on_failure`` answers
  ``None`` and the caller gives up (a crash loop needs a person, not more restarts).
- ``Doubling``: the waits of a loop that tries again until it works (a host that cannot be
  reached, a listing that fails): ``initial``, doubling up to ``maximum``, back to
  ``initial`` after a success.
- ``capped_exponential`` and ``jittered``: the formula both use, for the few callers that
  keep their own count of tries (notify's delivery).
"""

from __future__ import annotations

import enum
import random
from collections import deque
from collections.abc import Awaitable, Callable

import anyio

from launcher.errors import PolicyError

# An injected sleep: ``anyio.sleep`` in production, a fake clock's in tests.
Sleeper = Callable[[float], Awaitable[None]]


class Jitter(enum.StrEnum):
    """How the capped exponential delay ``d`` is randomised."""

    FULL = "full"  # uniform in [0, d]: spreads best, may restart at once
    EQUAL = "equal"  # d/2 + uniform in [0, d/2]: spreads, and always waits at least d/2
    NONE = "none"  # exactly d


def capped_exponential(n: int, initial: float, maximum: float) -> float:
    """The ``n``-th wait (``n >= 1``) of a doubling schedule: ``min(maximum, initial *
    2**(n-1))``; the exponent is clamped, so a huge ``n`` gives ``maximum``, not an error."""
    return min(maximum, initial * 2.0 ** min(max(n, 1) - 1, 1023))


def jittered(delay: float, jitter: Jitter, rng: random.Random) -> float:
    """``delay`` randomised by ``jitter``, drawing from ``rng``."""
    if jitter is Jitter.FULL:
        return rng.uniform(0.0, delay)
    if jitter is Jitter.EQUAL:
        return delay / 2 + rng.uniform(0.0, delay / 2)
    return delay


async def sleep_or(sleep: Sleeper, seconds: float, event: anyio.Event | None) -> None:
    """``await sleep(seconds)``, cut short once ``event`` is set (``None``: never). Timed
    waits that something may end early (a host back, a state change) go through the injected
    sleep this way, so a fake clock drives them as it drives every other wait."""
    if event is None:
        await sleep(seconds)
        return
    async with anyio.create_task_group() as tg:

        async def until_set() -> None:
            await event.wait()
            tg.cancel_scope.cancel()

        tg.start_soon(until_set)
        await sleep(seconds)
        tg.cancel_scope.cancel()


class Doubling:
    """The waits of a retry-until-it-works loop: ``initial``, ``2 * initial``, ... capped at
    ``maximum``; ``reset`` after a success starts again from ``initial``.

    ``current`` is the wait the next ``next()`` returns (what a "retrying in N s" message
    says); ``next()`` returns it and advances. No jitter: these loops wait on one host's
    answer (and most end early once another task reached it), not on a shared service.
    """

    def __init__(self, initial: float, maximum: float) -> None:
        if not 0 < initial <= maximum:
            raise PolicyError(f"doubling waits: need 0 < initial ({initial}) <= maximum "
                              f"({maximum})", remedy="pass a positive initial wait")
        self.initial = initial
        self.maximum = maximum
        self._tries = 0

    @property
    def current(self) -> float:
        return capped_exponential(self._tries + 1, self.initial, self.maximum)

    def next(self) -> float:
        """The wait before the next try; the one after it is twice as long (up to the cap)."""
        wait = self.current
        self._tries += 1
        return wait

    def reset(self) -> None:
        """The loop's operation worked: the next wait is ``initial`` again."""
        self._tries = 0


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
        delay = capped_exponential(self._streak, self.initial, self.maximum)
        return jittered(delay, self.jitter, self._rng)

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

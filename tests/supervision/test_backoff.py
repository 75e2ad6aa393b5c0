"""Tests of launcher.supervise.backoff: the restart backoff after ready and the doubling waits, with
explicit times (no sleeping), and ``sleep_or`` on a fake clock."""

from __future__ import annotations

import random

import anyio
import pytest

from launcher.errors import PolicyError
from launcher.supervise.backoff import (
    Doubling,
    Jitter,
    RestartBackoff,
    capped_exponential,
    sleep_or,
)
from tests.faketime import FakeTime


def exact(
    initial: float = 10.0,
    maximum: float = 60.0,
    healthy_reset: float = 100.0,
    budget: int = 100,
    window: float = 1000.0,
) -> RestartBackoff:
    return RestartBackoff(initial, maximum, healthy_reset, budget, window, jitter=Jitter.NONE)


def test_delays_double_from_initial_and_cap_at_maximum() -> None:
    """Without jitter the waits are 10, 20, 40, then the 60 s cap."""
    b = exact()
    assert [10.0, 20.0, 40.0, 60.0, 60.0] == [b.on_failure(float(t)) for t in range(5)]


def test_equal_jitter_waits_between_half_and_the_full_delay() -> None:
    """Equal jitter stays in [d/2, d] for each step of the doubling."""
    b = RestartBackoff(10.0, 60.0, 100.0, 100, 1000.0, random.Random(7))
    delays = [b.on_failure(float(t)) for t in range(6)]
    caps = [10.0, 20.0, 40.0, 60.0, 60.0, 60.0]
    assert all(d is not None and c / 2 <= d <= c for d, c in zip(delays, caps, strict=True))


def test_full_jitter_waits_between_zero_and_the_delay_and_is_seeded() -> None:
    """Full jitter stays in [0, d]; the same seed gives the same waits."""

    def run() -> list[float | None]:
        b = RestartBackoff(10.0, 60.0, 100.0, 100, 1000.0, random.Random(3), jitter=Jitter.FULL)
        return [b.on_failure(float(t)) for t in range(4)]

    first = run()
    assert first == run()
    caps = [10.0, 20.0, 40.0, 60.0]
    assert all(d is not None and 0 <= d <= c for d, c in zip(first, caps, strict=True))
    assert len(set(first)) == 4


def test_healthy_for_the_reset_time_starts_again_from_initial() -> None:
    """Healthy reports spanning healthy_reset seconds reset the doubling."""
    b = exact()
    b.on_failure(0.0)
    b.on_failure(1.0)
    b.on_healthy(50.0)
    b.on_healthy(150.0)
    assert (0, 10.0) == (b.streak, b.on_failure(151.0))


def test_a_short_healthy_stretch_keeps_doubling() -> None:
    """Healthy for less than healthy_reset: the next wait keeps doubling."""
    b = exact()
    b.on_failure(0.0)
    b.on_healthy(50.0)
    b.on_healthy(149.0)
    assert 20.0 == b.on_failure(149.5)


def test_dying_after_a_long_healthy_stretch_resets_too() -> None:
    """Ready at 50 and dead at 200 with no probe in between still counts as healthy for 150 s."""
    b = exact()
    b.on_failure(0.0)
    b.on_failure(1.0)
    b.on_healthy(50.0)
    assert 10.0 == b.on_failure(200.0)


def test_a_healthy_stretch_ends_at_a_failure() -> None:
    """Healthy time before a failure does not count toward the stretch after it."""
    b = exact()
    b.on_healthy(0.0)
    b.on_failure(50.0)
    b.on_healthy(60.0)
    b.on_healthy(120.0)
    assert 20.0 == b.on_failure(121.0)


def test_budget_exhausted_within_the_window_returns_none() -> None:
    """Three restarts allowed per 100 s: the fourth in the window is refused."""
    b = exact(budget=3, window=100.0)
    assert [10.0, 20.0, 40.0, None] == [b.on_failure(t) for t in (0.0, 10.0, 20.0, 30.0)]
    assert 3 == b.restarts_in_window(30.0)


def test_budget_frees_up_as_old_restarts_leave_the_window() -> None:
    """Once the first restart is older than the window, one more restart is granted."""
    b = exact(budget=2, window=100.0)
    b.on_failure(0.0)
    b.on_failure(50.0)
    assert b.on_failure(99.0) is None
    assert 40.0 == b.on_failure(100.0)
    assert b.on_failure(120.0) is None


def test_zero_budget_never_restarts() -> None:
    """A budget of 0 refuses the first restart."""
    assert exact(budget=0).on_failure(0.0) is None


def test_reset_forgets_streak_and_budget() -> None:
    """reset() starts over: initial wait and the whole budget."""
    b = exact(budget=1)
    b.on_failure(0.0)
    assert b.on_failure(1.0) is None
    b.reset()
    assert 10.0 == b.on_failure(2.0)


def test_default_rng_jitters_within_bounds() -> None:
    """Built positionally without an rng (as the supervisor does), waits stay in [d/2, d]."""
    b = RestartBackoff(10.0, 600.0, 1800.0, 5, 3600.0)
    delay = b.on_failure(0.0)
    assert delay is not None and 5.0 <= delay <= 10.0


def test_bad_settings_are_all_named() -> None:
    """Every invalid setting is listed in one PolicyError."""
    with pytest.raises(PolicyError) as info:
        RestartBackoff(0.0, -1.0, -1.0, -1, 0.0)
    message = str(info.value)
    for name in ("initial", "maximum", "healthy_reset", "budget", "window"):
        assert f"{name} (" in message


def test_time_going_backwards_is_refused() -> None:
    """A clock that goes backwards is a caller bug and raises PolicyError."""
    b = exact()
    b.on_failure(10.0)
    with pytest.raises(PolicyError, match="time went backwards"):
        b.on_healthy(5.0)


# --- the doubling waits of retry-until-it-works loops ------------------------------------


def test_doubling_waits_double_to_the_cap_and_reset_after_a_success() -> None:
    """0.5, 1, 2, 4, 8, then the 10 s cap; ``current`` is what the next wait will be; after
    ``reset`` the next wait is 0.5 again."""
    waits = Doubling(0.5, 10.0)
    announced = []
    taken = []
    for _ in range(7):
        announced.append(waits.current)
        taken.append(waits.next())
    assert [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0] == taken == announced
    waits.reset()
    assert (0.5, 0.5, 1.0) == (waits.current, waits.next(), waits.next())


def test_doubling_with_initial_equal_to_the_cap_never_grows() -> None:
    """A recheck interval shorter than the usual first wait: every wait is that interval."""
    waits = Doubling(0.05, 0.05)
    assert [0.05, 0.05, 0.05] == [waits.next() for _ in range(3)]


@pytest.mark.parametrize(("initial", "maximum"), [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0)])
def test_doubling_refuses_a_schedule_that_cannot_wait(initial: float, maximum: float) -> None:
    with pytest.raises(PolicyError, match="doubling waits"):
        Doubling(initial, maximum)


def test_capped_exponential_survives_a_huge_count() -> None:
    """The 5000th failure waits the cap; the exponent never overflows."""
    assert [1.0, 2.0, 4.0, 60.0, 60.0] == [
        capped_exponential(n, 1.0, 60.0) for n in (1, 2, 3, 7, 5000)]


# --- sleep_or: a wait that an event may end early ------------------------------------------


async def test_sleep_or_sleeps_the_whole_wait_when_nothing_happens() -> None:
    """The injected sleep is asked for exactly the seconds given; the fake clock moves by them."""
    time = FakeTime()
    await sleep_or(time.sleep, 2.5, anyio.Event())
    await sleep_or(time.sleep, 1.0, None)
    assert ([2.5, 1.0], 1003.5) == (time.sleeps, time())


async def test_sleep_or_returns_once_the_event_is_set() -> None:
    """A wait of an hour ends when the event is set, however long the sleep would be."""
    event = anyio.Event()
    hour_began = anyio.Event()
    returned: list[bool] = []

    async def an_hour(seconds: float) -> None:
        hour_began.set()
        await anyio.sleep_forever()

    async def wait() -> None:
        await sleep_or(an_hour, 3600.0, event)
        returned.append(True)

    with anyio.fail_after(10):  # a guard against a hang, not a measurement
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await hour_began.wait()
            assert [] == returned
            event.set()
    assert [True] == returned

"""Tests of the restart backoff after ready, with explicit times (no sleeping)."""

from __future__ import annotations

import random

import pytest

from launcher.backoff import Jitter, RestartBackoff
from launcher.errors import PolicyError


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

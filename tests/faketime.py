"""Time for tests: the clock and sleep pair every supervisor, notifier and transport takes.

- ``FakeTime``: a clock that moves only when the code under test sleeps (or the test says
  so). A sleep returns at once, having advanced the clock by exactly its seconds, so a
  schedule of waits is asserted exactly (``[1.0, 2.0, 4.0] == time.sleeps``) and a run that
  would take minutes takes milliseconds. For code whose every wait is the injected sleep
  and whose partners are fakes too: a real process keeps real time.
- ``RecordedSleep``: the real sleep, recorded. For runs with real processes (the sim servers),
  where the clock must stay real: a test asserts *which* waits were taken (the relaunch
  slept exactly the delay the backoff chose), never how long anything took.

    time = FakeTime()
    sup = ServerSupervisor(..., clock=time, sleep=time.sleep)
"""

from __future__ import annotations

import anyio
import anyio.lowlevel


class FakeTime:
    """A monotonic clock (call it) and its ``sleep``; ``sleeps`` lists every wait in order."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        """Advance the clock by ``seconds`` and let the other tasks run (a checkpoint, so a
        cancelled caller is cancelled here as with a real sleep)."""
        self.sleeps.append(seconds)
        self.now += max(0.0, seconds)
        await anyio.lowlevel.checkpoint()


class RecordedSleep:
    """``anyio.sleep``, with every wait's seconds kept in ``sleeps`` (in the order begun)."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        await anyio.sleep(seconds)

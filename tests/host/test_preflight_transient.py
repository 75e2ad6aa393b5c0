"""Preflight treats a host that cannot be asked right now as transient: a command timeout, a
refused session or a dropped connection is retried within a budget, never a fatal give-up.

Real sim servers on the local transport; the faults are injected by a fake transport (a
LocalTransport that fails chosen commands once each), never by mocking the supervisor.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from launcher.errors import (
    CommandTimedOut,
    HostUnreachable,
    LauncherError,
    RemoteCommandError,
    TransportError,
)
from launcher.host import preflight
from launcher.host.transport.base import CommandResult
from launcher.host.transport.local import LocalTransport
from launcher.supervise.lifecycle import State
from tests.supervise import SimSetup, ready_or_done, supervise

pytestmark = pytest.mark.timeout(90)

Match = Callable[[Sequence[str]], bool]


class Faulty(LocalTransport):
    """The sim host, except that each (match, error) of ``faults`` fails the next command it
    matches with ``error``, once."""

    def __init__(self, name: str, env: Mapping[str, str],
                 faults: list[tuple[Match, LauncherError]]) -> None:
        super().__init__(name, env=env)
        self.faults = faults
        self.injected: list[str] = []

    async def run(self, argv: Sequence[str], **kwargs: Any) -> CommandResult:
        for i, (match, error) in enumerate(self.faults):
            if match(argv):
                del self.faults[i]
                self.injected.append(type(error).__name__)
                raise error
        return await super().run(argv, **kwargs)


def nvidia_smi(argv: Sequence[str]) -> bool:
    return any("launcher.sim.nvidia_smi" in a for a in argv)


def port_check(argv: Sequence[str]) -> bool:
    return list(argv[:3]) == ["sh", "-c", preflight._PORT]


async def test_timeouts_refused_sessions_and_drops_in_preflight_are_retried(
    sim: SimSetup,
) -> None:
    """nvidia-smi times out, the connection drops on the next nvidia-smi, the session for
    the port check is refused: preflight retries and the server gets ready on
    attempt 1 (the bug: the first timeout was a fatal give-up)."""
    config = sim.config(mem_fraction_static=0.8, cuda_graph_max_bs=8)
    transport = Faulty("simhost", sim.host_env, [
        (nvidia_smi, CommandTimedOut("nvidia-smi timed out after 30 s", host="simhost")),
        (port_check, TransportError("simhost refused a session: open failed",
                                    host="simhost")),
        (nvidia_smi, HostUnreachable("connection to simhost lost", host="simhost")),
    ])

    result = await supervise(config, until=ready_or_done, transport=transport)

    rec = result.events
    assert State.READY == result.state, rec.summary()
    assert ["CommandTimedOut", "HostUnreachable", "TransportError"] == sorted(transport.injected)
    assert [1, 2, 3] == [r["try"] for r in rec.of("preflight.retry")]
    assert [1] == [s["attempt"] for s in rec.of("attempt.started")]
    assert not rec.has("server.gave_up")


async def test_a_command_that_fails_on_the_host_is_still_fatal_at_once(sim: SimSetup) -> None:
    """Not every error is transient: the port check exiting non-zero is the host's answer,
    so preflight gives up at once, without retries."""
    config = sim.config(mem_fraction_static=0.8, cuda_graph_max_bs=8)
    transport = Faulty("simhost", sim.host_env, [
        (port_check, RemoteCommandError("port check failed on simhost with exit status 2",
                                        host="simhost", exit_status=2)),
    ])

    result = await supervise(config, transport=transport)

    rec = result.events
    assert State.GAVE_UP == result.state, rec.summary()
    assert not rec.has("preflight.retry") and not rec.has("attempt.started")
    assert "port check failed" in rec.of("server.gave_up")[0]["reason"]


async def test_a_host_that_stays_unanswering_waits_instead_of_giving_up(sim: SimSetup) -> None:
    """Past its retries preflight waits (as for busy GPUs) and checks again; once the host
    answers, the server is launched."""
    config = sim.config(mem_fraction_static=0.8, cuda_graph_max_bs=8)
    timeouts = [(port_check, CommandTimedOut("port check timed out", host="simhost"))
                for _ in range(3)]
    transport = Faulty("simhost", sim.host_env, list(timeouts))

    result = await supervise(config, until=ready_or_done, transport=transport,
                             options={"preflight_tries": 2})

    rec = result.events
    assert State.READY == result.state, rec.summary()
    assert 3 == len(transport.injected)
    assert any("host cannot be asked now" in w.get("reason", "") for w in rec.of("gpu.waiting"))
    assert [1] == [s["attempt"] for s in rec.of("attempt.started")]

"""End to end over real SSH: the supervisor drives simulated SGLang servers on "remote" hosts.

Each host is a real sshd on 127.0.0.1 in front of a simulated GPU host (tests/sshsim.py); the
servers run detached under the host's run_dir exactly as on a real GPU box, are followed,
probed and stopped through the SSH transport, and are SIGKILLed at teardown whatever happened.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from launcher.config.schema import Config
from launcher.errors import HostUnreachable
from launcher.host import health
from launcher.host import run as remote
from launcher.host.transport.base import CommandResult, Transport
from launcher.sglang.logparse import LineSplitter
from launcher.supervise.lifecycle import State
from launcher.supervise.supervisor import RunningAttempt, ServerSupervisor, supervise_all
from tests.simhost import free_port, model_dir
from tests.sshd import Sshd, keygen
from tests.sshsim import (
    SIM_VERSION,
    EventRecorder,
    RecordingSSHTransport,
    Site,
    cmdline,
    environ,
    kill_leftovers,
    server_entry,
    ssh_config,
    transport_for,
)

pytestmark = pytest.mark.ssh

READY_OR_DONE = frozenset({State.READY, State.GAVE_UP, State.STOPPED})


class LineRecordingSupervisor(ServerSupervisor):
    """Test-only hook: keeps every log line the follower hands the parser, per attempt."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lines: dict[int, list[str]] = {}
        self.attempts: dict[int, RunningAttempt] = {}

    async def _on_line(self, att: RunningAttempt, line: str) -> None:
        self.lines.setdefault(att.handle.attempt, []).append(line)
        self.attempts[att.handle.attempt] = att
        await super()._on_line(att, line)


@pytest.fixture
def sites(tmp_path: Path) -> Iterator[Callable[..., Site]]:
    """Factory of sites under tmp_path; every server launched on them is killed at teardown."""
    made: list[Site] = []

    def make(name: str, sshd: Sshd, **kwargs: Any) -> Site:
        site = Site.create(tmp_path, name, sshd, **kwargs)
        made.append(site)
        return site

    yield make
    kill_leftovers(site.run_dir for site in made)


@asynccontextmanager
async def ssh_transports(
    config: Config, **overrides: dict[str, Any]
) -> AsyncIterator[dict[str, RecordingSSHTransport]]:
    """One SSH transport per host of ``config`` (``overrides[host]`` passed to it), closed
    on exit."""
    transports = {h.name: transport_for(config, h.name, **overrides.get(h.name, {}))
                  for h in config.hosts}
    try:
        yield transports
    finally:
        with anyio.CancelScope(shield=True):
            for transport in transports.values():
                await transport.aclose()


def supervisor(
    config: Config,
    name: str,
    transports: Mapping[str, Transport],
    events: EventRecorder,
) -> ServerSupervisor:
    """The supervisor ``launcher up`` builds for server ``name``, reporting to ``events``."""
    server = config.server(name)
    return ServerSupervisor(config, server, transports[server.host],
                            sglang_version=SIM_VERSION, hooks=[events])


@asynccontextmanager
async def supervising(*sups: ServerSupervisor) -> AsyncIterator[None]:
    """Supervise for the body; then stop supervising (servers stay up until teardown)."""
    async with anyio.create_task_group() as tg:
        for sup in sups:
            await tg.start(sup.run)
        try:
            yield
        finally:
            for sup in sups:
                sup.request_stop(kill=False)
            with anyio.move_on_after(10.0, shield=True):
                while True:
                    if all(sup.state.terminal for sup in sups):
                        break
                    await anyio.sleep(0.02)
            tg.cancel_scope.cancel()


async def wait_until(
    predicate: Callable[[], bool], timeout: float, events: EventRecorder, what: str
) -> None:
    """Poll ``predicate``; AssertionError naming ``what`` and the events so far on timeout."""
    try:
        with anyio.fail_after(timeout):
            while True:
                if predicate():
                    return
                await anyio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"{what} not within {timeout}s; events: {events.names()}") from None


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# -- start-up over SSH -----------------------------------------------------------------------


async def test_capture_oom_backs_off_to_ready_over_ssh(
    sshd_host: Sshd, sites: Callable[..., Site], tmp_path: Path
) -> None:
    """The 70B sim's capture OOM on 2 GPUs is read over SSH, the next attempt has a lower
    fraction and gets ready, and its /health is probed through an SSH port forward."""
    site = sites("gpu1", sshd_host)
    port = free_port()
    config = ssh_config(tmp_path, [site.host_entry()], [server_entry(
        "llm", site, model="llama-70b-sim", gpus=[0, 1], port=port,
        mem_fraction_static=0.99, cuda_graph_max_bs=256,
    )])
    events = EventRecorder()
    async with ssh_transports(config) as transports:
        sup = supervisor(config, "llm", transports, events)
        async with supervising(sup):
            await wait_until(lambda: sup.state in READY_OR_DONE, 60, events, "ready")
            final = sup.state
    started = [e.data["params"] for e in events.named("attempt.started")]
    failed = [(e.data["attempt"], e.data["outcome"], e.data["phase"])
              for e in events.named("attempt.failed")]
    ready = events.first("server.ready")
    probes = events.named("probe.result")
    assert State.READY == final
    assert [(1, "oom_graph_capture", "cuda_graph")] == failed
    assert [started[1]] == [e.data["params"] for e in events.named("policy.decided")]
    assert {"mem_fraction_static": 0.99, "cuda_graph_max_bs": 256} == started[0]
    assert 2 == len(started)
    assert started[1]["mem_fraction_static"] < 0.99
    assert ready is not None
    assert 2 == ready.data["attempts"]
    assert started[1] == ready.data["params"]
    # The probe went through a forward (a direct channel) to the port the server listens on.
    forwarded = transports["gpu1"].forwards
    assert [port] == sorted({remote for remote, _ in forwarded})
    assert all(local != port for _, local in forwarded)
    assert any(p.data["ok"] for p in probes)


class SecondHostSshd(Sshd):
    """A real sshd on 127.0.0.2: a host whose own address is not 127.0.0.1."""

    host = "127.0.0.2"


@pytest.mark.parametrize("agent", [True, False], ids=["agent", "channel"])
async def test_a_server_listening_on_its_hosts_own_address_is_probed_there(
    tmp_path_factory: pytest.TempPathFactory, sites: Callable[..., Site], tmp_path: Path,
    agent: bool,
) -> None:
    """A server on a host reached at 127.0.0.2 with listen = "127.0.0.2" (the host's own
    address, as docs/router.md advises for a server that a router on another host reaches)
    binds only that address. The probes dial it there: made by the host's agent (as
    ``launcher up`` does) or through a direct channel. The server is ready at its first
    attempt, never a "hang in warmup", and ``status``'s check (a Unix-socket forward)
    reaches it too."""
    sshd = SecondHostSshd(tmp_path_factory.mktemp("sshd-b"))
    sshd.start()
    try:
        site = sites("gpu-b", sshd)
        port = free_port()
        config = ssh_config(tmp_path, [site.host_entry()], [
            server_entry("llm", site, port=port, listen="127.0.0.2")])
        events = EventRecorder()
        async with ssh_transports(config) as transports:
            sup = supervisor(config, "llm", transports, events)

            def settled() -> bool:
                return sup.state in READY_OR_DONE or bool(events.named("attempt.failed"))

            if agent:
                with anyio.fail_after(90):
                    await supervise_all([sup], until_ready=True)  # then stops supervising
            else:
                async with supervising(sup):
                    await wait_until(settled, 90, events, "ready or a failed attempt")
            address = config.server("llm").probe_address
            async with health.client_for(transports["gpu-b"], port, address, 5.0) as (
                    client, url):
                checked = await health.check(client, url, 5.0)
            dialled = transports["gpu-b"].dialled
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        sshd.stop()
    assert [] == events.named("attempt.failed")
    assert 1 == len(events.named("server.ready"))
    assert (True, "HTTP 200") == checked
    assert any(p.data["ok"] for p in events.named("probe.result"))
    # Every forward and channel had the host dial the listen address, never 127.0.0.1; with
    # the agent, the probes took none (status's check is the one forward).
    assert {("127.0.0.2", port)} == set(dialled)
    assert (1 == len(dialled)) == agent


# -- SSH drops -------------------------------------------------------------------------------


async def test_ssh_drops_mid_load_and_after_ready_lose_no_line_and_no_server(
    sshd_host: Sshd, sites: Callable[..., Site], tmp_path: Path
) -> None:
    """Killing every SSH connection during weight loading and again after ready is reported
    as host.unreachable, relaunches nothing, keeps the server's pid, and the supervisor's
    follower saw exactly the log file's lines, none lost or repeated."""
    site = sites("gpu1", sshd_host)
    faults = site.sim.write_faults([{"kind": "slow", "phase": "weights", "factor": 25}])
    config = ssh_config(tmp_path, [site.host_entry()], [server_entry(
        "llm", site, port=free_port(), env={"SGLANG_SIM_FAULTS": str(faults)},
    )])
    events = EventRecorder()
    async with ssh_transports(config) as transports:
        sup = LineRecordingSupervisor(config, config.server("llm"), transports["gpu1"],
                                      sglang_version=SIM_VERSION, hooks=[events])
        async with supervising(sup):
            await wait_until(lambda: sup.state is State.WEIGHTS, 60, events, "weights")
            pid = site.server_pid("llm", 1)
            await anyio.sleep(0.3)
            first_kill = time.monotonic()
            state_at_first_kill = sup.state
            assert sshd_host.kill_connections() >= 1
            await wait_until(lambda: sup.state in READY_OR_DONE, 60, events, "ready")
            await wait_until(lambda: len(events.named("probe.result")) >= 3, 10, events, "probes")
            second_kill = time.monotonic()
            size_at_second_kill = len(site.log_bytes("llm", 1))
            assert sshd_host.kill_connections() >= 1
            # Probes keep passing through the forward after the drop, and the follower
            # catches up with everything the server writes meanwhile.
            await wait_until(
                lambda: any(e.at > second_kill + 0.5 and e.data["ok"]
                            for e in events.named("probe.result")),
                10, events, "a probe after the drop",
            )
            size_after = len(site.log_bytes("llm", 1))
            await wait_until(lambda: sup.attempts[1].offset >= size_after, 10, events, "catch-up")
            final = sup.state
        offset = sup.attempts[1].offset
    log_bytes = site.log_bytes("llm", 1)
    unreachable = [e.at for e in events.named("host.unreachable")]
    assert State.WEIGHTS == state_at_first_kill
    assert State.READY == final
    assert 1 == len(events.named("attempt.started"))
    assert [] == events.named("attempt.failed") + events.named("server.unhealthy")
    assert any(first_kill < at < second_kill for at in unreachable)
    assert any(at > second_kill for at in unreachable)
    assert pid == sup.machine.pid == site.server_pid("llm", 1)
    assert alive(pid)
    assert offset >= size_at_second_kill
    assert LineSplitter().feed(log_bytes[:offset]) == sup.lines[1]


# -- refused and unreachable hosts -----------------------------------------------------------


async def test_unknown_host_key_gives_up_naming_the_fingerprint(
    sshd_host: Sshd, sites: Callable[..., Site], tmp_path: Path
) -> None:
    """A host whose key is not in known_hosts is refused: the server gives up at once with
    the offered fingerprint in the reason, and nothing is launched."""
    site = sites("gpu1", sshd_host)
    empty = tmp_path / "known_hosts_without_gpu1"
    empty.write_text("")
    config = ssh_config(tmp_path, [site.host_entry(known_hosts=str(empty))],
                        [server_entry("llm", site, port=free_port())])
    events = EventRecorder()
    connected_before = sshd_host.connections_seen()
    async with ssh_transports(config) as transports:
        sup = supervisor(config, "llm", transports, events)
        async with supervising(sup):
            await wait_until(lambda: sup.state in READY_OR_DONE, 20, events, "gave up")
            final = sup.state
    gave_up = events.first("server.gave_up")
    assert State.GAVE_UP == final
    assert gave_up is not None
    assert sshd_host.host_key_fingerprint in gave_up.data["reason"]
    assert "not in" in gave_up.data["reason"]
    assert [] == events.named("attempt.started")
    assert not site.run_dir.exists()
    # "At once" is counted, not timed: one connection, refused, and no retry.
    assert connected_before + 1 == sshd_host.connections_seen()
    assert 0 == sshd_host.accepted_logins()


async def test_rejected_user_key_gives_up_without_a_retry_loop(
    sshd_host: Sshd, sites: Callable[..., Site], tmp_path: Path
) -> None:
    """A user key the host rejects ends in server.gave_up naming the key, within a few
    connection attempts (one per supervisor step, no retries) and without a launch."""
    site = sites("gpu1", sshd_host)
    stranger = tmp_path / "stranger_key"
    keygen(stranger, "stranger")
    config = ssh_config(tmp_path, [site.host_entry(identity_file=str(stranger))],
                        [server_entry("llm", site, port=free_port())])
    events = EventRecorder()
    async with ssh_transports(config) as transports:
        sup = supervisor(config, "llm", transports, events)
        async with supervising(sup):
            await wait_until(lambda: sup.state in READY_OR_DONE, 20, events, "gave up")
            final = sup.state
            connections = sshd_host.connections_seen()
            await anyio.sleep(1.0)
            connections_later = sshd_host.connections_seen()
    gave_up = events.first("server.gave_up")
    assert State.GAVE_UP == final
    assert gave_up is not None
    assert "rejected our key" in gave_up.data["reason"]
    assert str(stranger) in gave_up.data["reason"]
    assert [] == events.named("attempt.started")
    assert 1 <= connections <= 3  # "without a retry loop": counted, not timed
    assert connections == connections_later
    assert 0 == sshd_host.accepted_logins()


async def test_host_down_at_start_is_reported_then_supervision_proceeds(
    make_sshd: Callable[[], Sshd], sites: Callable[..., Site], tmp_path: Path
) -> None:
    """With nothing listening on the host's SSH port the supervisor reports the host as
    unreachable and the server as unknown (its attempts cannot be listed, so nothing is
    launched); once sshd comes up on that port the server gets ready."""
    sshd = make_sshd()
    sshd.stop()  # same port and keys, nothing listening
    site = sites("gpu1", sshd)
    config = ssh_config(tmp_path, [site.host_entry()],
                        [server_entry("llm", site, port=free_port())])
    events = EventRecorder()
    fast_retries = {"retry_attempts": 2, "retry_max_seconds": 1.0}
    async with ssh_transports(config, gpu1=fast_retries) as transports:
        sup = supervisor(config, "llm", transports, events)
        async with supervising(sup):
            await wait_until(lambda: events.first("server.unknown") is not None, 15, events,
                             "waiting on the unreachable host")
            await anyio.sleep(1.0)
            up_at = time.monotonic()
            await anyio.to_thread.run_sync(sshd.start)
            await wait_until(lambda: sup.state in READY_OR_DONE, 60, events, "ready")
            final = sup.state
    reported = [e for e in events.events if "cannot reach host gpu1" in str(e.data)]
    started = events.named("attempt.started")
    assert State.READY == final
    assert reported
    assert all(e.at < up_at for e in reported)
    assert 1 == len(started)
    assert started[0].at > up_at


# -- several hosts ---------------------------------------------------------------------------


async def test_two_hosts_come_up_together_and_a_failing_host_stops_no_other(
    make_sshd: Callable[[], Sshd], sites: Callable[..., Site], tmp_path: Path
) -> None:
    """supervise_all brings one server up on each of two SSH hosts (each its own sim host)
    while a third host is down (its server unknown, nothing launched there); then losing the
    second host for good leaves the first one ready and healthy."""
    a, b = sites("gpu-a", make_sshd()), sites("gpu-b", make_sshd())
    down_sshd = make_sshd()
    down_sshd.stop()
    c = sites("gpu-c", down_sshd)
    config = ssh_config(
        tmp_path,
        [a.host_entry(), b.host_entry(), c.host_entry()],
        [
            server_entry("llm-a", a, port=free_port()),
            server_entry("llm-b", b, model="llama-70b-sim", gpus=[0, 1], port=free_port(),
                         mem_fraction_static=0.85, cuda_graph_max_bs=192),
            server_entry("llm-c", c, port=free_port(), policy={"gpu_free_timeout": "3s"}),
        ],
    )
    events = EventRecorder()
    fast_retries = {"retry_attempts": 2, "retry_max_seconds": 1.0}
    sim_hosts: dict[str, bytes] = {}
    lost_at = 0.0

    def up() -> bool:
        return [State.READY, State.READY, State.UNKNOWN] == [s.state for s in sups]

    async def lose_host_b() -> None:
        nonlocal lost_at
        await wait_until(up, 60, events, "a and b ready, c unknown")
        for site, name in ((a, "llm-a"), (b, "llm-b")):
            sim_hosts[name] = environ(site.server_pid(name, 1))[b"SGLANG_SIM_HOST"]
        lost_at = time.monotonic()
        await anyio.to_thread.run_sync(b.sshd.stop)
        await wait_until(
            lambda: len([e for e in events.named("probe.result", "llm-a")
                         if e.at > lost_at + 1.0 and e.data["ok"]]) >= 3,
            15, events, "healthy probes of a after b was lost",
        )
        for sup in sups:
            sup.request_stop(kill=False)

    async with ssh_transports(config, **{"gpu-b": fast_retries, "gpu-c": fast_retries}
                              ) as transports:
        sups = [supervisor(config, name, transports, events)
                for name in ("llm-a", "llm-b", "llm-c")]
        with anyio.fail_after(100):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lose_host_b)
                await supervise_all(sups)
    ready = {e.server for e in events.named("server.ready")}
    assert {"llm-a", "llm-b"} == ready
    assert ["llm-c"] == [e.server for e in events.named("server.unknown")]
    assert [] == events.named("server.gave_up")
    assert [] == events.named("attempt.started", "llm-c")
    assert any(e.at > lost_at for e in events.named("host.unreachable", "llm-b"))
    assert [] == [e.name for e in events.events if e.server == "llm-a" and e.name in
                  ("attempt.failed", "probe.failed", "host.unreachable", "server.unhealthy")]
    assert 1 == len(events.named("attempt.started", "llm-a"))
    # Each server ran on its own sim host, reached through its own sshd.
    assert {"llm-a": str(a.sim.path).encode(), "llm-b": str(b.sim.path).encode()} == sim_hosts
    assert alive(a.server_pid("llm-a", 1))


# -- death and hostile input -----------------------------------------------------------------


async def test_sigkill_of_a_ready_server_is_reported_as_died_over_ssh(
    sshd_host: Sshd, sites: Callable[..., Site], tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    """A SIGKILLed ready server is reported as process.died (status 137). The detection time
    is recorded, not asserted: scripts/bench/bench_scale.py measures it."""
    site = sites("gpu1", sshd_host)
    config = ssh_config(tmp_path, [site.host_entry()],
                        [server_entry("llm", site, port=free_port())])
    events = EventRecorder()
    async with ssh_transports(config) as transports:
        sup = supervisor(config, "llm", transports, events)
        async with supervising(sup):
            await wait_until(lambda: sup.state in READY_OR_DONE, 60, events, "ready")
            await anyio.sleep(0.5)  # let the follower settle into its steady state
            pid = site.server_pid("llm", 1)
            killed_at = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            await wait_until(lambda: events.first("process.died") is not None, 10, events,
                             "process.died")
    died = events.first("process.died")
    assert died is not None
    detection_s = died.at - killed_at
    record_property("sigkill_detection_s", round(detection_s, 3))
    print(f"sigkill_detection_s={detection_s:.3f}")
    assert {"exit_status": 137, "phase": "ready", "attempt": 1} == died.data


HOSTILE = "sp ace 'single' \"double\" ;semi $(dollar) `tick` \\back $HOME * ~ é"


async def test_hostile_strings_reach_the_sim_byte_for_byte(
    sshd_host: Sshd, sites: Callable[..., Site], tmp_path: Path
) -> None:
    """model_path, extra_args, server env and host env values full of shell syntax reach the
    simulated server unchanged over SSH, and none of the commands hidden in them runs."""
    site = sites("gpu1", sshd_host)
    markers = [tmp_path / f"pwned{i}" for i in range(4)]
    inject = (f";touch {markers[0]};$(touch {markers[1]})`touch {markers[2]}`"
              f"'; touch {markers[3]}; '")
    model = tmp_path / f"models 'q' \"d\" {inject}" / "tiny $(sim)"
    model.mkdir(parents=True)
    shutil.copy(model_dir("tiny-1b-sim") / "config.json", model / "config.json")
    arg_value = HOSTILE + inject + "\nsecond line"
    env_value = "\n" + HOSTILE + inject + " trailing "
    host_value = HOSTILE + inject
    config = ssh_config(
        tmp_path,
        [site.host_entry(env={"SGLANG_SIM_HOST": str(site.sim.path), "SIM_HOST_NOTE": host_value})],
        [server_entry("llm", site, port=free_port(), model_path=str(model),
                      extra_args=["--attention-backend", arg_value],
                      env={"SIM_NOTE": env_value, "SIM_EMPTY": ""})],
    )
    events = EventRecorder()
    async with ssh_transports(config) as transports:
        sup = supervisor(config, "llm", transports, events)
        async with supervising(sup):
            await wait_until(lambda: sup.state in READY_OR_DONE, 60, events, "ready")
            final = sup.state
            pid = site.server_pid("llm", 1)
            argv, env = cmdline(pid), environ(pid)
    assert State.READY == final
    assert str(model).encode() == argv[argv.index(b"--model-path") + 1]
    assert arg_value.encode() == argv[argv.index(b"--attention-backend") + 1]
    assert env_value.encode() == env[b"SIM_NOTE"]
    assert b"" == env[b"SIM_EMPTY"]
    assert host_value.encode() == env[b"SIM_HOST_NOTE"]
    assert [] == [m for m in markers if m.exists()]
    assert [] == sorted(p.name for p in Path.home().glob("pwned*"))


class DropsTheLaunch:
    """The real SSH transport, except that the connection is killed (for real, through sshd)
    around the first launch command: ``after_running`` loses only its reply, otherwise the
    command never reaches the host. Either way the caller gets the HostUnreachable the SSH
    transport raises for a connection lost mid-command."""

    def __init__(self, inner: RecordingSSHTransport, sshd: Sshd, *, after_running: bool) -> None:
        self.inner = inner
        self.sshd = sshd
        self.after_running = after_running
        self.dropped = False
        self.host_name = inner.host_name

    async def run(self, argv: Sequence[str], *, stdin: bytes | None = None,
                  env: Mapping[str, str] | None = None, timeout: float | None = 30.0,
                  check: bool = False) -> CommandResult:
        if stdin is None or self.dropped:  # only the launch sends stdin (the env file)
            return await self.inner.run(argv, stdin=stdin, env=env, timeout=timeout,
                                        check=check)
        self.dropped = True
        if self.after_running:
            await self.inner.run(argv, stdin=stdin, env=env, timeout=timeout, check=check)
        await anyio.to_thread.run_sync(self.sshd.kill_connections)
        raise HostUnreachable(f"connection to {self.host_name} lost while running the launch",
                              host=self.host_name)

    def stream(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
               ) -> AsyncIterator[bytes]:
        return self.inner.stream(argv, env=env)

    def forward_port(self, remote_port: int, address: str,
                     ) -> AbstractAsyncContextManager[tuple[str, int]]:
        return self.inner.forward_port(remote_port, address)

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.mark.parametrize("after_running", [True, False], ids=["reply-lost", "never-sent"])
async def test_ssh_drop_during_the_launch_neither_loses_nor_doubles_the_server(
    sshd_host: Sshd, sites: Callable[..., Site], tmp_path: Path, after_running: bool
) -> None:
    """A connection lost around the launch command ends in exactly one server for the
    attempt: the one it started (reply lost) or the one a resent launch starts."""
    site = sites("gpu1", sshd_host)
    config = ssh_config(tmp_path, [site.host_entry()],
                        [server_entry("llm", site, port=free_port())])
    events = EventRecorder()
    async with ssh_transports(config) as transports:
        flaky = DropsTheLaunch(transports["gpu1"], sshd_host, after_running=after_running)
        sup = supervisor(config, "llm", {"gpu1": flaky}, events)
        async with supervising(sup):
            await wait_until(lambda: sup.state in READY_OR_DONE, 60, events, "ready")
            final = sup.state
    attempts = sorted(p.name for p in (site.run_dir / "llm").iterdir())
    pid = site.server_pid("llm", 1)
    assert flaky.dropped
    assert State.READY == final
    assert ["1"] == attempts
    assert 1 == len(events.named("attempt.started"))
    assert [] == events.named("launch.failed") + events.named("attempt.failed")
    assert pid == sup.machine.pid
    assert alive(pid)


LOOKALIKE_WRITER = (
    "import sys, time\n"
    "out = sys.stdout.buffer\n"
    "for i in range(40):\n"
    "    out.write(b'line %d \\x01launcher-follow-end-' % i); out.flush(); time.sleep(0.005)\n"
    "    out.write(b'0123abcd:0 - %d\\n\\x01' % i); out.flush(); time.sleep(0.005)\n"
    "out.write(b'\\x01launcher-follow-'); out.flush()\n"
)


async def test_follow_over_ssh_is_byte_exact_with_marker_lookalikes(
    sshd_host: Sshd, sites: Callable[..., Site]
) -> None:
    """A log full of fake end-of-follow markers, split across writes and ending in a partial
    one, is followed over SSH byte for byte, then the exit status arrives."""
    site = sites("gpu1", sshd_host)
    config = ssh_config(site.run_dir.parent, [site.host_entry()], [])
    transport = transport_for(config, "gpu1")
    spec = remote.AttemptSpec("writer", 1, str(site.run_dir),
                              [sys.executable, "-c", LOOKALIKE_WRITER], {})
    received = b""
    ends: list[remote.RunExited] = []
    try:
        handle = await remote.launch(transport, spec)
        with anyio.fail_after(20):
            async with aclosing(remote.follow(transport, handle)) as items:
                async for item in items:
                    if isinstance(item, remote.LogChunk):
                        received += item.data
                        assert len(received) == item.end_offset
                    else:
                        ends.append(item)
    finally:
        await transport.aclose()
    log = await anyio.Path(handle.log_path).read_bytes()
    assert (log, [remote.RunExited(0)]) == (received, ends)


SLOW_WRITER = (
    "import sys, time\n"
    "for i in range(120):\n"
    "    sys.stdout.write(f'{i:04d} ' + 'y' * (i % 50) + '\\n'); sys.stdout.flush()\n"
    "    time.sleep(0.02)\n"
)


def host_followers(server_pid: int) -> list[int]:
    """Pids of the host-side follower of ``server_pid``: each ``tail --pid`` and its shell."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if argv[0] == b"tail" and f"--pid={server_pid}".encode() in argv:
            found += [int(stat.rsplit(")", 1)[1].split()[1]), int(entry.name)]
    return found


async def test_follow_over_ssh_survives_its_host_side_follower_being_killed(
    sshd_host: Sshd, sites: Callable[..., Site]
) -> None:
    """SIGKILLing the follower's shell and tail on the host mid-log (so its stream ends
    without the exit trailer) loses and repeats nothing, and the exit status still arrives."""
    site = sites("gpu1", sshd_host)
    transport = transport_for(ssh_config(site.run_dir.parent, [site.host_entry()], []), "gpu1")
    spec = remote.AttemptSpec("writer", 1, str(site.run_dir),
                              [sys.executable, "-c", SLOW_WRITER], {})
    received = b""
    ends: list[remote.RunExited] = []
    killed: list[int] = []
    try:
        handle = await remote.launch(transport, spec)
        with anyio.fail_after(20):
            async with aclosing(remote.follow(transport, handle)) as items:
                async for item in items:
                    if isinstance(item, remote.RunExited):
                        ends.append(item)
                        continue
                    received += item.data
                    if not killed and len(received) > 1000:
                        killed = host_followers(handle.pid)
                        for pid in killed:  # the shell first: no trailer gets written
                            os.kill(pid, signal.SIGKILL)
    finally:
        await transport.aclose()
    log = await anyio.Path(handle.log_path).read_bytes()
    assert 2 == len(killed)
    assert (log, [remote.RunExited(0)]) == (received, ends)
    assert 120 == len(log.splitlines())

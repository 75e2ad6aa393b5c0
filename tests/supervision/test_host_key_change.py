"""A host key that changes mid-run is fatal for that host at once: the message names the old
and the new fingerprint and no further command reaches the host.

Real sshd on 127.0.0.1 in front of a simulated GPU host; the "change" is the daemon restarted
on the same port with a freshly generated host key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest

from launcher.errors import HostKeyChanged
from launcher.supervise.lifecycle import State
from launcher.supervise.supervisor import ServerSupervisor
from tests.simhost import free_port
from tests.sshd import Sshd, fingerprint, keygen
from tests.sshsim import (
    SIM_VERSION,
    EventRecorder,
    Site,
    kill_leftovers,
    server_entry,
    ssh_config,
    transport_for,
)

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(90)]


@pytest.fixture
def site(sshd_host: Sshd, tmp_path: Path) -> Iterator[Site]:
    made = Site.create(tmp_path, "gpu1", sshd_host)
    yield made
    kill_leftovers([made.run_dir])


def new_host_key(sshd: Sshd) -> str:
    """Restart ``sshd`` on its port with a new host key; the new key's fingerprint."""
    sshd.stop()
    for path in (sshd.host_key, Path(f"{sshd.host_key}.pub")):
        path.unlink()
    keygen(sshd.host_key, "reinstalled-host")
    sshd.start()
    return fingerprint(Path(f"{sshd.host_key}.pub"))


def sessions_started(sshd: Sshd) -> int:
    """Commands sshd ran for clients so far (LogLevel VERBOSE logs each)."""
    return sshd.log_text().count("Starting session: command")


async def supervise_until(sup: ServerSupervisor, done: Callable[[], bool],
                          timeout: float) -> None:
    with anyio.fail_after(timeout):
        while True:
            if done():
                return
            await anyio.sleep(0.02)


@pytest.mark.parametrize("known_hosts_updated", [False, True],
                         ids=["known_hosts_unchanged", "known_hosts_accepts_the_new_key"])
async def test_a_host_key_change_mid_run_gives_up_at_once_naming_both_keys(
    sshd_host: Sshd, site: Site, tmp_path: Path, known_hosts_updated: bool,
) -> None:
    """The server is ready; sshd comes back with another key. The supervisor gives up on the
    server at once with a reason naming the old and the new fingerprint, the server is left
    running, and no command runs on the host afterwards, even when known_hosts was changed
    to accept the new key (the key is pinned for the life of the process)."""
    old = sshd_host.host_key_fingerprint
    config = ssh_config(tmp_path, [site.host_entry()],
                        [server_entry("llm", site, port=free_port())])
    events = EventRecorder()
    transport = transport_for(config, "gpu1")
    sup = ServerSupervisor(config, config.server("llm"), transport, sglang_version=SIM_VERSION,
                           hooks=[events])
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(sup.run)
            await supervise_until(sup, lambda: sup.state is State.READY, 60)
            pid = site.server_pid("llm", 1)

            new = new_host_key(sshd_host)
            if known_hosts_updated:
                sshd_host.known_hosts.write_text(sshd_host.known_hosts_line())
            ran_before = sessions_started(sshd_host)
            connected_before = sshd_host.connections_seen()
            await supervise_until(sup, lambda: sup.state.terminal, 30)
            connections_to_give_up = sshd_host.connections_seen() - connected_before
            await anyio.sleep(2.0)  # anything still trying would show up by now
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await transport.aclose()

    assert State.GAVE_UP == sup.state, events.names()
    [gave_up] = events.named("server.gave_up")
    reason: str = gave_up.data["reason"]
    assert f"it was {old}, it is now {new}" in reason, reason
    assert "no further commands are sent to gpu1" in reason
    assert not events.named("attempt.started")[1:]  # nothing relaunched
    assert not events.named("process.stopped")  # nothing killed: the host is not trusted
    assert sessions_started(sshd_host) == ran_before  # no command reached the host
    assert site.server_pid("llm", 1) == pid
    # "At once" is counted, not timed: the first connection that met the new key ended it
    # (no retries, no backoff), and none was made after.
    assert 1 == connections_to_give_up
    assert connected_before + 1 == sshd_host.connections_seen()
    with pytest.raises(HostKeyChanged):  # and none will: the transport refuses at once
        await transport.run(["true"])
    assert sessions_started(sshd_host) == ran_before


def test_fingerprints_differ(sshd_host: Sshd) -> None:
    """The test's premise: the restarted daemon's regenerated key has another fingerprint."""
    old = sshd_host.host_key_fingerprint
    assert old != new_host_key(sshd_host)

"""Command prefixes that put the server somewhere else (a PID namespace, a container).

A prefix that keeps the server a descendant in launcher's process group and session (e.g.
``unshare --fork --pid --mount-proc``) is supported: stop and kill reach the server inside the
namespace. Tested with real sshd, the simulated host and real namespaces (needs root).
Container exec clients (``docker exec`` and the like) are rejected at config time
(tests/config/test_config.py, id command-docker-exec).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.supervise.lifecycle import State
from tests.simhost import free_port
from tests.sshd import Sshd
from tests.sshsim import EventRecorder, Site, kill_leftovers, server_entry, ssh_config
from tests.test_ssh_e2e import alive, ssh_transports, supervising, supervisor, wait_until

pytestmark = pytest.mark.ssh

UNSHARE = ["unshare", "--fork", "--pid", "--mount-proc"]


@pytest.fixture
def stock_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    daemon = Sshd(tmp_path_factory.mktemp("stock-sshd"), max_sessions=None)
    daemon.start()
    yield daemon
    daemon.stop()


def site_processes(site: Site) -> list[int]:
    """Live processes (host pids) whose environment names ``site``'s sim host."""
    marker = f"SGLANG_SIM_HOST={site.sim.path}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in env and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def pid_namespace(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/pid")


async def test_stop_reaches_a_server_in_its_own_pid_namespace(
    stock_sshd: Sshd, tmp_path: Path
) -> None:
    """With ``unshare --fork --pid --mount-proc`` before the server, the server runs in a PID
    namespace of its own; stopping with kill ends it and every process of it (none left).

    (As the namespace's PID 1, SGLang's own kill_process_tree cannot SIGKILL itself after the
    SIGTERM, so it is the stop's SIGKILL from outside, after the grace, that ends it.)"""
    site = Site.create(tmp_path, "gpu1", stock_sshd)
    config = ssh_config(tmp_path, [site.host_entry()], [server_entry(
        "llm", site, port=free_port(), command=[*UNSHARE, *site.server_command])])
    events = EventRecorder()
    try:
        async with ssh_transports(config) as transports:
            sup = supervisor(config, "llm", transports, events)
            async with supervising(sup):
                await wait_until(lambda: sup.state is State.READY, 60, events, "ready")
                before = site_processes(site)
                namespaces = {pid_namespace(p) for p in before}
                sup.request_stop(kill=True)
                await wait_until(lambda: sup.state is State.STOPPED, 60, events, "stopped")
            after = site_processes(site)
    finally:
        kill_leftovers([site.run_dir])
    stopped = events.named("process.stopped")
    print(f"unshare: {len(before)} processes in {len(namespaces)} pid namespaces; "
          f"stopped with {stopped[0].data['signals']}; left {after}")
    assert len(namespaces) == 2  # unshare itself here, the server and its children inside
    assert [] == after
    assert [] == stopped[0].data["leftover_pids"]

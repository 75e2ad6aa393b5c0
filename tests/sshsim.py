"""Helpers for supervising simulated SGLang servers over real SSH (tests/test_ssh_e2e.py).

A :class:`Site` is one "remote GPU host": a real sshd on 127.0.0.1 (tests.sshd) in front of a
simulated GPU host (tests.simhost). :func:`ssh_config` turns sites and server entries into a
validated :class:`launcher.config.schema.Config` whose hosts use ``transport = "ssh"`` with the
fixture's identity file and known_hosts, ``use_ssh_config = false``, the sim ``nvidia-smi``
shim and the sim host's environment; :func:`server_entry` runs the ``sglang-sim-server`` shim.

    site = Site.create(tmp_path, "gpu1", sshd, gpu_count=2)
    config = ssh_config(tmp_path, [site.host_entry()], [server_entry("llm", site, ...)])
    events = EventRecorder()
    sup = ServerSupervisor(config, config.server("llm"), transport_for(config, "gpu1"), ...)

Resource handling: every server a test launches runs detached under a site's ``run_dir``;
:func:`kill_leftovers` SIGKILLs each attempt's whole session (the server and its scheduler
holders, orphaned ones included; the wrapper shell then records the status and exits), waiting
for attempts still being launched, and is what a test's teardown calls whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from launcher.config.load import config_from_dict
from launcher.config.schema import Config
from launcher.host.transport.ssh import SSHTransport
from launcher.supervise import events as ev
from tests import procs
from tests.simhost import SimHost, make_sim_host, model_dir
from tests.sshd import Sshd

SIM_VERSION = "0.5.23"


@dataclass(frozen=True)
class Site:
    """A real sshd in front of a simulated GPU host; ``run_dir`` holds the attempts."""

    name: str
    sshd: Sshd
    sim: SimHost
    run_dir: Path

    @classmethod
    def create(
        cls,
        tmp_path: Path,
        name: str,
        sshd: Sshd,
        *,
        gpu_count: int = 2,
        gpu_total_gib: float = 79.19,
        time_scale: float = 0.003,
    ) -> Site:
        """A sim host under ``tmp_path/name`` reached through ``sshd``."""
        root = tmp_path / name
        sim = make_sim_host(
            root, gpu_count=gpu_count, gpu_total_gib=gpu_total_gib, time_scale=time_scale
        )
        return cls(name=name, sshd=sshd, sim=sim, run_dir=root / "runs")

    @property
    def server_command(self) -> list[str]:
        """The argv prefix starting a sim server on this host (works over SSH)."""
        return [str(self.sim.bin_dir / "sglang-sim-server")]

    def host_entry(self, **overrides: Any) -> dict[str, Any]:
        """The ``[[hosts]]`` table reaching this site over SSH; ``overrides`` win."""
        entry: dict[str, Any] = {
            "name": self.name,
            "transport": "ssh",
            "address": self.sshd.host,
            "port": self.sshd.port,
            "user": self.sshd.user,
            "identity_file": str(self.sshd.identity_file),
            "known_hosts": str(self.sshd.known_hosts),
            "use_ssh_config": False,
            "connect_timeout": "5s",
            "keepalive_interval": "2s",
            "nvidia_smi": [str(self.sim.bin_dir / "nvidia-smi")],
            "env": {"SGLANG_SIM_HOST": str(self.sim.path)},
            "run_dir": str(self.run_dir),
        }
        entry.update(overrides)
        return entry

    def attempt_dir(self, server: str, attempt: int) -> Path:
        return self.run_dir / server / str(attempt)

    def server_pid(self, server: str, attempt: int) -> int:
        """The pid the launch recorded for ``attempt`` of ``server`` (``procs.started_pid``:
        above 1, and the recorded process while one with that pid lives)."""
        return procs.started_pid(self.attempt_dir(server, attempt))

    def log_bytes(self, server: str, attempt: int) -> bytes:
        return (self.attempt_dir(server, attempt) / "log").read_bytes()


def server_entry(
    name: str,
    site: Site,
    *,
    model: str = "tiny-1b-sim",
    model_path: str | None = None,
    gpus: Sequence[int] = (0,),
    port: int,
    **overrides: Any,
) -> dict[str, Any]:
    """A ``[[servers]]`` table running the sim server shim of ``site``; ``overrides`` win.

    ``tp`` defaults to the number of GPUs; ``model_path`` defaults to the shipped ``model``.
    """
    entry: dict[str, Any] = {
        "name": name,
        "host": site.name,
        "model_path": model_path or str(model_dir(model)),
        "tp": len(gpus),
        "gpus": list(gpus),
        "port": port,
        "sglang_version": SIM_VERSION,
        "command": site.server_command,
    }
    entry.update(overrides)
    return entry


# Small budgets: the sim plays SGLang's minutes out in fractions of a second.
FAST_POLICY: dict[str, Any] = {
    "probe_interval": "300ms",
    "gpu_free_timeout": "15s",
    "start_deadline": "90s",
    "restart_backoff_initial": "1s",
    "restart_backoff_max": "2s",
    "stall": {
        "init": "15s",
        "weights": "15s",
        "kv_cache": "15s",
        "cuda_graph": "15s",
        "warmup": "15s",
    },
}


def ssh_config(
    tmp_path: Path,
    hosts: Sequence[Mapping[str, Any]],
    servers: Sequence[Mapping[str, Any]],
    *,
    policy: Mapping[str, Any] | None = None,
) -> Config:
    """A validated Config (no LAUNCHER_* environment) with FAST_POLICY updated by ``policy``."""
    merged = {**FAST_POLICY, **(policy or {})}
    data = {
        "state_dir": str(tmp_path / "state"),
        "policy": merged,
        "hosts": [dict(h) for h in hosts],
        "servers": [dict(s) for s in servers],
    }
    return config_from_dict(data, environ={})


class RecordingSSHTransport(SSHTransport):
    """The real SSH transport; also records every port forward as (remote port, local port
    or Unix socket path, or "channel" for a direct channel without a local end), and in
    ``dialled`` the (address, port) each one had the host dial."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.forwards: list[tuple[int, int | str]] = []
        self.dialled: list[tuple[str, int]] = []  # (address, port) the host was asked to dial

    @asynccontextmanager
    async def forward_port(self, remote_port: int, address: str,
                           ) -> AsyncIterator[tuple[str, int]]:
        async with super().forward_port(remote_port, address) as here:
            self.forwards.append((remote_port, here[1]))
            self.dialled.append((address, remote_port))
            yield here

    @asynccontextmanager
    async def forward_unix(self, remote_port: int, address: str) -> AsyncIterator[str]:
        async with super().forward_unix(remote_port, address) as path:
            self.forwards.append((remote_port, path))
            self.dialled.append((address, remote_port))
            yield path

    async def connect_port(self, remote_port: int, address: str) -> anyio.abc.ByteStream:
        stream = await super().connect_port(remote_port, address)
        self.forwards.append((remote_port, "channel"))
        self.dialled.append((address, remote_port))
        return stream


def transport_for(config: Config, host: str, **overrides: Any) -> RecordingSSHTransport:
    """The SSH transport ``launcher up`` builds for ``host`` (make_transport), recording its
    forwards; ``overrides`` (e.g. small retry budgets) win."""
    transport = RecordingSSHTransport.from_host_config(config.host(host), **overrides)
    assert isinstance(transport, RecordingSSHTransport)
    return transport


@dataclass
class Event:
    """One supervisor event as a hook saw it, with the monotonic time it arrived."""

    at: float
    server: str
    name: str
    data: dict[str, Any]


@dataclass
class EventRecorder:
    """A supervisor hook that keeps every event (the hook only appends: it never blocks)."""

    events: list[Event] = field(default_factory=list)
    clock: Callable[[], float] = time.monotonic

    def __call__(self, server: str, event: ev.Event) -> None:
        # Kept as the log shows it: the dotted name and the payload.
        self.events.append(Event(self.clock(), server, event.name, event.to_dict()))

    def named(self, name: str, server: str | None = None) -> list[Event]:
        return [
            e for e in self.events if e.name == name and (server is None or e.server == server)
        ]

    def names(self, server: str | None = None, *, skip: Iterable[str] = ("probe.result",)) -> list[
        str
    ]:
        """Event names in order (probe results left out unless ``skip`` is empty)."""
        left_out = set(skip)
        return [
            e.name
            for e in self.events
            if e.name not in left_out and (server is None or e.server == server)
        ]

    def first(self, name: str, server: str | None = None) -> Event | None:
        found = self.named(name, server)
        return found[0] if found else None


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 2 (comm) may hold spaces and parentheses; everything after the last ')' is plain.
    return text.rsplit(")", 1)[1].split()


def _session_members(sid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields and fields[0] != "Z" and (int(fields[2]) == sid or int(fields[3]) == sid):
            members.append(int(entry.name))
    return members


def _recorded_sessions(run_dir: Path, pid_wait_s: float) -> list[int]:
    """Pids of the servers recorded under ``run_dir`` that still are the same process.

    An attempt with neither a pid nor an exit status may be mid-launch (a supervisor
    cancelled while its launch command ran still starts the server): wait up to
    ``pid_wait_s`` for its pid.
    """
    pids = []
    deadline = time.monotonic() + pid_wait_s
    for attempt in sorted(run_dir.glob("*/*/")):
        pid_file = attempt / "pid"
        while not pid_file.exists() and not (attempt / "exit_status").exists():
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        pid = procs.recorded_pid(attempt)
        if pid is not None:
            pids.append(pid)
    return pids


def kill_leftovers(run_dirs: Iterable[Path], timeout: float = 5.0) -> list[int]:
    """SIGKILL every process in the session or group of every server recorded under
    ``run_dirs`` (never a process that merely reuses a recorded pid); return the pids killed.

    Servers still being launched are waited for (up to ``timeout``). The wrappers, in
    sessions of their own, write exit_status and exit once their server is gone.
    """
    killed: list[int] = []
    for run_dir in run_dirs:
        for sid in _recorded_sessions(run_dir, timeout):
            for pid in _session_members(sid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
    deadline = time.monotonic() + timeout
    while any(_alive(pid) for pid in killed) and time.monotonic() < deadline:
        time.sleep(0.02)
    return killed


def _alive(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def cmdline(pid: int) -> list[bytes]:
    """The exact argv bytes of a live process."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]


def environ(pid: int) -> dict[bytes, bytes]:
    """The exact environment bytes of a live process."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")[:-1]
    return dict(item.split(b"=", 1) for item in raw if b"=" in item)

"""Test helpers for supervising simulated SGLang servers on the local transport.

    sim = SimSetup.create(tmp_path)
    config = sim.config(model="llama-70b-sim", tp=2, mem_fraction_static=0.99)
    result = await supervise(config, until=lambda rec: rec.has("server.ready"))
    ...
    sim.cleanup()          # what the ``sim`` fixture of the test modules does at teardown

Every ``SimSetup`` has its own sim host (GPUs, state), run dir, launcher state dir and port.
Servers are detached on purpose, so a test must clean up: ``SimSetup.cleanup`` SIGCONTs and
SIGKILLs the process group of every attempt found under the run dir whose pid is the process
the launch recorded (``tests/procs.py``: above 1, start time matching ``pid_start``; orphaned
holders included: they stay in their server's group) and of every extra process registered
with ``hold_gpu``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from launcher.config.load import config_from_dict
from launcher.config.schema import Config
from launcher.host.transport.base import Transport
from launcher.host.transport.local import LocalTransport
from launcher.sim import gpustate
from launcher.supervise import events as ev
from launcher.supervise.lifecycle import State
from launcher.supervise.supervisor import ServerSupervisor
from tests import procs
from tests.simhost import REPO, SimHost, free_port, make_sim_host, model_dir

SERVER = "sim0"
HOST = "simhost"


@dataclass(frozen=True)
class Recorded:
    """One hook call: when (``time.monotonic()``), which event, its data."""

    t: float
    name: str
    data: dict[str, Any]


@dataclass
class Recorder:
    """An event hook that keeps every call, in order, with a monotonic timestamp.

    ``on`` callbacks run inside the hook (so in the supervisor's task): they must be quick.
    """

    events: list[Recorded] = field(default_factory=list)
    on: list[Callable[[Recorded], None]] = field(default_factory=list)

    def __call__(self, server: str, event: ev.Event) -> None:
        rec = Recorded(time.monotonic(), event.name, event.to_dict())  # as the log shows it
        self.events.append(rec)
        for callback in self.on:
            callback(rec)

    def names(self, *, probes: bool = False) -> list[str]:
        """Event names in order (``probe.result`` left out unless ``probes``)."""
        return [e.name for e in self.events if probes or e.name != "probe.result"]

    def of(self, name: str) -> list[dict[str, Any]]:
        """The data of every ``name`` event, in order."""
        return [e.data for e in self.events if e.name == name]

    def first(self, name: str) -> Recorded:
        """The first ``name`` event; AssertionError listing what came instead."""
        for e in self.events:
            if e.name == name:
                return e
        raise AssertionError(f"no {name!r} event; got {self.names()}")

    def summary(self) -> str:
        """The events (probes left out) one per line, for assertion messages."""
        return "\n".join(
            f"{e.t:.3f} {e.name} {e.data}"[:400] for e in self.events if e.name != "probe.result"
        )

    def has(self, name: str, count: int = 1) -> bool:
        return sum(1 for e in self.events if e.name == name) >= count

    async def wait_for(self, name: str, timeout: float = 45.0, count: int = 1) -> Recorded:
        """Wait until ``count`` ``name`` events were recorded; the last of them."""
        with anyio.fail_after(timeout):
            while True:
                if self.has(name, count):
                    break
                await anyio.sleep(0.01)
        return [e for e in self.events if e.name == name][count - 1]


@dataclass
class Result:
    """How a supervised run ended."""

    state: State
    events: Recorder
    supervisor: ServerSupervisor
    stopped_by_test: bool


@dataclass
class SimSetup:
    """One test's sim host, run dir, launcher state dir and server port."""

    root: Path
    host: SimHost
    run_dir: Path
    state_dir: Path
    port: int
    extra_pids: list[int] = field(default_factory=list)

    @classmethod
    def create(
        cls,
        tmp_path: Path,
        *,
        gpu_count: int = 2,
        gpu_total_gib: float = 79.19,
        time_scale: float = 0.003,
    ) -> SimSetup:
        host = make_sim_host(
            tmp_path, gpu_count=gpu_count, gpu_total_gib=gpu_total_gib, time_scale=time_scale
        )
        return cls(tmp_path, host, tmp_path / "run", tmp_path / "state", free_port())

    # -- configuration ----------------------------------------------------------------

    @property
    def host_env(self) -> dict[str, str]:
        """What the sim's processes need on top of launcher's environment."""
        env = self.host.env
        return {
            "SGLANG_SIM_HOST": env["SGLANG_SIM_HOST"],
            "PYTHONPATH": env["PYTHONPATH"],
            "no_proxy": env["no_proxy"],
        }

    def data(
        self,
        *,
        model: str = "tiny-1b-sim",
        tp: int = 1,
        mem_fraction_static: float | None = None,
        cuda_graph_max_bs: int | None = None,
        faults: list[dict[str, Any]] | None = None,
        policy: Mapping[str, Any] | None = None,
        stall: Mapping[str, Any] | None = None,
        server: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The config as a TOML-shaped dict: one local host, one sim server, small budgets.

        ``faults`` become a profile file named by SGLANG_SIM_FAULTS in the server's env;
        ``policy``/``stall``/``server`` entries replace the defaults below.
        """
        env: dict[str, str] = {}
        if faults is not None:
            env["SGLANG_SIM_FAULTS"] = str(self.host.write_faults(faults))
        srv: dict[str, Any] = {
            "name": SERVER,
            "host": HOST,
            "model_path": str(model_dir(model)),
            "tp": tp,
            "gpus": list(range(tp)),
            "port": self.port,
            "sglang_version": "0.5.23",
            "command": [sys.executable, "-m", "launcher.sim.server"],
            "env": env,
        }
        if mem_fraction_static is not None:
            srv["mem_fraction_static"] = mem_fraction_static
        if cuda_graph_max_bs is not None:
            srv["cuda_graph_max_bs"] = cuda_graph_max_bs
        srv.update(server or {})
        pol: dict[str, Any] = {
            "probe_interval": "200ms",
            "probe_failures": 2,
            "gpu_free_timeout": "10s",
            "start_deadline": "60s",
            "restart_backoff_initial": "200ms",
            "restart_backoff_max": "1s",
            "max_attempts": 4,
        }
        pol.update(policy or {})
        # Generous stall budgets: a loaded test machine must not look like a hang. Tests of
        # stalls set their phase's budget small.
        pol["stall"] = {
            "init": "30s", "weights": "30s", "kv_cache": "30s", "cuda_graph": "30s",
            "warmup": "30s", **(stall or {}),
        }
        return {
            "state_dir": str(self.state_dir),
            "policy": pol,
            "hosts": [
                {
                    "name": HOST,
                    "transport": "local",
                    "nvidia_smi": [sys.executable, "-m", "launcher.sim.nvidia_smi"],
                    "env": self.host_env,
                    "run_dir": str(self.run_dir),
                }
            ],
            "servers": [srv],
        }

    def config(self, **kwargs: Any) -> Config:
        """``data(**kwargs)`` validated into a Config (no LAUNCHER_* overrides read)."""
        return config_from_dict(self.data(**kwargs), environ={})

    def write_toml(self, data: Mapping[str, Any], name: str = "launcher.toml") -> Path:
        """``data`` as a TOML file in the test's directory; returns its path."""
        path = self.root / name
        path.write_text(_toml(data))
        tomllib.loads(path.read_text())  # a helper bug must not look like a launcher bug
        return path

    # -- the run dir ------------------------------------------------------------------

    def attempt_dir(self, attempt: int) -> Path:
        return self.run_dir / SERVER / str(attempt)

    def attempts(self) -> list[int]:
        """Attempt numbers present in the run dir."""
        base = self.run_dir / SERVER
        if not base.is_dir():
            return []
        return sorted(int(p.name) for p in base.iterdir() if p.name.isdigit())

    def pid(self, attempt: int) -> int:
        """The server pid ``attempt`` recorded. Fails the test unless it is a pid above 1 and,
        while a process with that pid lives, that process is the one the launch recorded
        (``pid_start``): a test signals only what it started."""
        return procs.started_pid(self.attempt_dir(attempt))

    def cmd(self, attempt: int) -> str:
        return (self.attempt_dir(attempt) / "cmd").read_text()

    def log(self, attempt: int) -> str:
        return (self.attempt_dir(attempt) / "log").read_text(errors="replace")

    def alive(self, attempt: int) -> bool:
        return not (self.attempt_dir(attempt) / "exit_status").exists() and pid_alive(
            self.pid(attempt)
        )

    # -- GPU memory held by someone else --------------------------------------------------

    def hold_gpu(self, gpu: int, gib: float) -> subprocess.Popen[bytes]:
        """Start a foreign process registered in the sim's GPU state as holding ``gib`` on
        ``gpu``; the memory is free once the process is gone (kill and wait for it)."""
        proc = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(120)"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.extra_pids.append(proc.pid)
        hostcfg = gpustate.SimGpuHost.load(self.host.path, {})
        deadline = time.monotonic() + 5
        while (holder := gpustate.holder_of(proc, gpu, "foreign")).start < 0:
            assert time.monotonic() < deadline, "the foreign holder did not start"
            time.sleep(0.01)
        gpustate.Registration(hostcfg, proc.pid, [holder]).update({gpu: gib})
        return proc

    # -- teardown ---------------------------------------------------------------------

    def server_pids(self) -> list[int]:
        """Every live server recorded under the run dir that the launch really started (pid
        above 1, start time matching ``pid_start``); a forged or recycled pid is left out."""
        return [
            pid for a in self.attempts()
            if (pid := procs.recorded_pid(self.attempt_dir(a))) is not None
        ]

    def cleanup(self) -> None:
        """Kill every process group this test started on the sim host (idempotent).

        A launch cut short by the test may still be starting its server: an attempt
        directory without a pid file gets a moment for it to appear.
        """
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and any(
            not (self.attempt_dir(a) / "pid").exists() for a in self.attempts()
        ):
            time.sleep(0.02)
        for pid in [*self.server_pids(), *self.extra_pids]:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                procs.signal_group(pid, sig)
        for pid in self.extra_pids:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        deadline = time.monotonic() + 5
        while any(group_alive(p) for p in self.server_pids()) and time.monotonic() < deadline:
            time.sleep(0.02)


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return raw.rpartition(")")[2].split()[0] not in ("Z", "X")


def group_alive(pgid: int) -> bool:
    """Whether any live process is in process group ``pgid``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


async def supervise(
    config: Config,
    *,
    until: Callable[[Recorder], bool] | None = None,
    timeout: float = 45.0,
    recorder: Recorder | None = None,
    adopt: bool = True,
    stop_when: Callable[[Recorder], bool] | None = None,
    clock: Callable[[], float] = time.monotonic,
    on_start: Callable[[ServerSupervisor], None] | None = None,
    transport: Transport | None = None,
    options: Mapping[str, Any] | None = None,
) -> Result:
    """Run a ServerSupervisor for the config's only server with an event-recording hook.

    Returns once the machine is terminal (gave up / stopped), or once ``until(recorder)``
    holds: supervision is then cancelled like a killed launcher, leaving the server running.
    Once ``stop_when(recorder)`` holds, a stop with kill is requested (as ``launcher up
    --stop-on-exit`` does on Ctrl-C). ``on_start`` gets the supervisor before it runs (for
    hooks that must act on it synchronously). TimeoutError after ``timeout`` seconds (the
    supervision is cancelled first). ``transport`` replaces the local transport to the sim
    host (a fake that injects faults); ``options`` are more ServerSupervisor arguments.
    """
    server = config.servers[0]
    if transport is None:
        transport = LocalTransport(server.host, env=config.host(server.host).env)
    rec = recorder if recorder is not None else Recorder()
    sup = ServerSupervisor(
        config, server, transport, sglang_version=server.sglang_version or "0.5.23",
        hooks=[rec], clock=clock, **dict(options or {}),
    )
    if on_start is not None:
        on_start(sup)
    stopped = False
    stop_requested = False
    with anyio.fail_after(timeout):
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                await sup.run(adopt=adopt)
                tg.cancel_scope.cancel()

            tg.start_soon(run)
            while not sup.state.terminal:
                if until is not None and until(rec):
                    stopped = True
                    tg.cancel_scope.cancel()
                    break
                if stop_when is not None and not stop_requested and stop_when(rec):
                    stop_requested = True
                    sup.request_stop(kill=True)
                await anyio.sleep(0.01)
    return Result(sup.state, rec, sup, stopped)


def ready_or_done(rec: Recorder) -> bool:
    """``until`` for "the server is ready"."""
    return rec.has("server.ready")


def run_cli(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """``launcher *args`` as a real subprocess (``python -m launcher.cli.main``), output
    captured."""
    return subprocess.run(
        cli_argv(*args), cwd=REPO, env=cli_env(env), capture_output=True, text=True,
        timeout=timeout,
    )


def cli_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "launcher.cli.main", *args]


def cli_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """launcher's own environment: no LAUNCHER_* overrides from the outside, wide columns."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("LAUNCHER_")}
    env.update(COLUMNS="200", NO_COLOR="1", PYTHONUNBUFFERED="1")
    env.update(extra or {})
    return env


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects among ``text``'s lines (other lines skipped)."""
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                found.append(json.loads(line))
    return found


# --- a small TOML writer (the standard library only reads TOML) -------------------------


def _toml(data: Mapping[str, Any]) -> str:
    lines: list[str] = []
    _table(lines, [], data)
    return "\n".join(lines) + "\n"


def _table(lines: list[str], path: Sequence[str], table: Mapping[str, Any]) -> None:
    scalars = {k: v for k, v in table.items() if not _is_table(v) and not _is_table_list(v)}
    for key, value in scalars.items():
        lines.append(f"{_key(key)} = {_value(value)}")
    for key, value in table.items():
        if _is_table(value):
            lines.append("")
            lines.append(f"[{'.'.join(_key(p) for p in (*path, key))}]")
            _table(lines, [*path, key], value)
        elif _is_table_list(value):
            for entry in value:
                lines.append("")
                lines.append(f"[[{'.'.join(_key(p) for p in (*path, key))}]]")
                _table(lines, [*path, key], entry)


def _is_table(value: Any) -> bool:
    return isinstance(value, Mapping)


def _is_table_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)


def _key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, Mapping):  # an inline table inside an array, or an empty table
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {value!r} as TOML")

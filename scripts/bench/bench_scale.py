#!/usr/bin/env python3
"""Scale benchmark: one launcher supervising N simulated SGLang servers (docs/benchmarks.md).

Usage::

    .venv/bin/python scripts/bench/bench_scale.py --servers 50,100,200 [--transport local|ssh]
        [--hosts 2] [--window 60] [--probe-interval 10] [--kills 20] [--log-rate-at max]
        [--ramp all|batched] [--ssh-home clean|user] [--json results.json]
        [--budget-minutes 15]

For every N (and first for N=1, the baseline of the death-detection target), on a fresh sim
setup in a temporary directory:

1. **Ramp.** ``launcher up CONFIG --log-format json`` (the real CLI, in its own process and
   session) starts and supervises N servers: tiny-1b-sim, tp=1, one simulated 8 GiB GPU each,
   sim ``time_scale`` 0.003, ports below the kernel's ephemeral range (so no port-forward
   listener or client socket can take one first). ``local``: one sim host with N GPUs on the
   local transport. ``ssh``: ``--hosts`` real sshd daemons on 127.0.0.1 (tests/sshd.py with
   MaxSessions raised and, by default, an empty HOME for the sessions: see BenchSshd), each in
   front of its own sim host; servers are dealt round-robin. The script waits until every
   server is ready (or gave up). ``--ramp batched`` first brings them up ``--batch`` at a
   time with ``launcher up -s ... --until-ready`` and then lets one ``launcher up`` adopt all.
2. **Steady state.** After ``--settle`` seconds (longer than the probe interval, so every
   server probes at its READY cadence), the launcher's own CPU (utime+stime of
   /proc/PID/stat, all its threads, over ``--window`` seconds, as % of one core) and RSS
   (VmRSS sampled every second). The followers' CPU (the launcher's ``tail -F`` children, or
   every sshd process tree) is reported separately.
3. **Death detection.** ``--kills`` times, one at a time: SIGKILL the server process of a
   random ready server (its scheduler holders die with it by PDEATHSIG) and take the time
   from the kill to the ``process.died`` event (the event's own timestamp). N=1 waits for the
   restarted server to be ready before the next kill; with N>1 each victim is a different
   server and the next kill follows 1-2 s later, while the previous victim restarts.
4. **Log rate** (for the N chosen by ``--log-rate-at``). The CLI is stopped with SIGTERM
   (servers keep running) and an in-process ``supervise_all`` (``--role driver``, same
   config, same ServerSupervisor, a subclass that only *observes* each line the follower
   hands to ``_on_line``) adopts all N servers. A writer process (``--role writer``) appends
   SGLang "Decode batch" lines stamped with CLOCK_MONOTONIC to one server's attempt log at
   increasing rates, ``--rate-seconds`` each; the driver measures write-to-line lag. A rate
   is *sustained* when every line arrived and the p99 lag stayed under 1 s.

Everything stops by itself: each wait has a timeout, the whole run has ``--budget-minutes``,
and the ``finally`` blocks (also on SIGTERM / Ctrl-C) stop the launcher / driver / writer,
SIGKILL every sim server session recorded under the run dirs (tests.sshsim.kill_leftovers)
and stop the sshd daemons. Each launcher's JSON events are kept next to its stderr
(``*.events.jsonl``, probe results left out) when ``--workdir`` keeps the directory.

Memory: one sim server is three Python processes (server + scheduler holder + detokenizer
holder, ~51 MB RSS / ~28 MB PSS together) plus its wrapper shell and a ``tail``; the script
measures it and skips an N whose estimate exceeds 80 % of MemAvailable (saying so).
``--sim replay`` runs launcher/sim/replay.py instead: one ~5 MiB process per server that
replays a recorded run of the real sim (same log bytes, own pid and port, real /health), so
that N=1000 fits; see its docstring for what it does not model. No N starts while
MemAvailable is under ``--min-available-gib`` (10).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[2]
REPLAY = REPO / "launcher" / "sim" / "replay.py"
if str(REPO) not in sys.path:  # tests.* helpers are not installed; run from anywhere
    sys.path.insert(0, str(REPO))

from launcher.sglang import logparse as lp  # noqa: E402
from launcher.sglang.phases import Phase  # noqa: E402
from launcher.supervise import events  # noqa: E402
from tests.simhost import make_sim_host, model_dir  # noqa: E402
from tests.sshd import Sshd  # noqa: E402
from tests.sshsim import Site, kill_leftovers, server_entry  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
SIM_VERSION = "0.5.23"
GPU_GIB = 8.0
BENCH_MARK = " bench_r="
END_MARK = " bench_end "
SUSTAINED_P99_S = 1.0
DEFAULT_LADDER = "100,300,1000,3000,10000,30000,100000"
# Targets per transport (docs/benchmarks.md): (N the target is for, CPU % of one core, RSS MiB).
TARGETS = {"local": (200, 2.0, 100.0), "ssh": (1000, 10.0, 300.0)}
TARGET_DETECT_DELTA_S = 0.5
TARGET_READER_LINES_S = 50_000


# ---------------------------------------------------------------------------------------------
# /proc


def proc_cpu_s(pid: int) -> float | None:
    """utime + stime of ``pid`` (all its threads), in seconds; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_status(pid: int, key: str) -> int | None:
    """A numeric field of /proc/PID/status (kB for sizes)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def proc_pss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def proc_children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found += [int(c) for c in (task / "children").read_text().split()]
    return found


def proc_tree(pid: int) -> list[int]:
    out = [pid]
    for child in proc_children(pid):
        out += proc_tree(child)
    return out


def count_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def mem_available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024**2
    return 0.0


def host_cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


# ---------------------------------------------------------------------------------------------
# Config


def toml_text(data: Mapping[str, Any]) -> str:
    """A TOML document for the nested dicts / lists / scalars of a launcher config."""
    lines: list[str] = []

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, Mapping):
            return "{" + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + "}"
        raise TypeError(f"cannot write {v!r} as TOML")

    def table(path: list[str], t: Mapping[str, Any]) -> None:
        for k, v in t.items():
            if not isinstance(v, Mapping) and not (
                isinstance(v, list) and v and isinstance(v[0], Mapping)
            ):
                lines.append(f"{json.dumps(k)} = {value(v)}")
        for k, v in t.items():
            if isinstance(v, Mapping):
                lines.append(f"\n[{'.'.join(json.dumps(p) for p in [*path, k])}]")
                table([*path, k], v)
            elif isinstance(v, list) and v and isinstance(v[0], Mapping):
                for entry in v:
                    lines.append(f"\n[[{'.'.join(json.dumps(p) for p in [*path, k])}]]")
                    table([*path, k], entry)

    table([], data)
    return "\n".join(lines) + "\n"


def free_ports(n: int, rng: random.Random) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 now, below the kernel's ephemeral range.

    Below it, so that no ephemeral port (a launcher's port-forward listener, a probe's
    client socket, another program's connection) can take a server's port before the
    server binds it.
    """
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    candidates = list(range(max(1024, low - 12000), low))
    rng.shuffle(candidates)
    ports: list[int] = []
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == n:
            return ports
    raise RuntimeError(f"fewer than {n} free ports below {low}")


class BenchSshd(Sshd):
    """The test sshd with room for one follower session per server plus the short commands,
    and optionally a clean HOME for the sessions.

    OpenSSH's default MaxSessions is 10 (the fixture has 50); launcher keeps one exec session
    open per server (``tail -F``), so a host with more servers than that needs it raised.

    ``clean_home``: bash sources ``~/.bashrc`` for every command sshd runs (Debian's
    SSH_SOURCE_BASHRC), and this machine's root ``.bashrc`` runs ``pyenv init`` (~120 ms of
    CPU per command, like a ``conda init`` block on a GPU host). ``SetEnv HOME=<empty dir>``
    measures launcher without that cost; ``--ssh-home user`` keeps it.
    """

    def __init__(self, directory: Path, max_sessions: int | None, clean_home: bool) -> None:
        super().__init__(directory, max_sessions=max_sessions)  # None: stock (10)
        self.home = directory / "home" if clean_home else None

    def _write_config(self) -> None:
        super()._write_config()
        text = self.config_file.read_text()
        text = text.replace("LogLevel VERBOSE", "LogLevel INFO")
        if self.home is not None:
            self.home.mkdir(exist_ok=True)
            text = text.replace("SetEnv LAUNCHER_TEST_SSHD=1",
                                f"SetEnv LAUNCHER_TEST_SSHD=1 HOME={self.home}")
        self.config_file.write_text(text)


@dataclass
class Rig:
    """One N's sim setup: the config file, server names, run dirs and daemons to stop."""

    root: Path
    config_path: Path
    servers: list[str]
    run_dir_of: dict[str, Path]
    sshds: list[Sshd] = field(default_factory=list)

    @property
    def run_dirs(self) -> list[Path]:
        return sorted(set(self.run_dir_of.values()))

    def attempt_dir(self, server: str) -> Path | None:
        base = self.run_dir_of[server] / server
        try:
            numbers = [int(p.name) for p in base.iterdir() if p.name.isdigit()]
        except OSError:
            return None
        return base / str(max(numbers)) if numbers else None

    def server_pid(self, server: str) -> tuple[int, int] | None:
        """(pid, attempt) of the server's newest attempt while it runs, else None."""
        d = self.attempt_dir(server)
        if d is None or (d / "exit_status").exists():
            return None
        try:
            pid = int((d / "pid").read_text())
        except (OSError, ValueError):
            return None
        return (pid, int(d.name)) if proc_cpu_s(pid) is not None else None

    def stop(self) -> None:
        """SIGKILL every sim server session recorded under the run dirs; stop the daemons."""
        with contextlib.suppress(Exception):
            kill_leftovers(self.run_dirs)
        for sshd in self.sshds:
            with contextlib.suppress(Exception):
                sshd.stop()


def policy(probe_interval: float, initial: str = "auto") -> dict[str, Any]:
    """Generous start-up budgets (N servers start at once on 2 cores); quick restarts.
    ``initial`` "configured" skips the memory estimate (one nvidia-smi per server, one
    server after the other, before any launch: ~0.8 s each here)."""
    return {
        "initial": initial,
        "probe_interval": f"{probe_interval}s",
        "start_deadline": "900s",
        "gpu_free_timeout": "120s",
        "restart_backoff_initial": "1s",
        "restart_backoff_max": "1s",
        "restart_budget": 1000,
        "stall": {p: "300s" for p in ("init", "weights", "kv_cache", "cuda_graph", "warmup")},
    }


def build_rig(root: Path, n: int, args: argparse.Namespace) -> Rig:
    root.mkdir(parents=True, exist_ok=True)
    ports = free_ports(n, random.Random(args.seed * 1000 + n))
    names = [f"s{i:03d}" for i in range(n)]
    model = str(model_dir("tiny-1b-sim"))
    extra = ["--skip-server-warmup"] if args.skip_warmup else []
    # --sim replay: the lean stand-in (launcher/sim/replay.py) instead of the real sim.
    replay_env = {"SGLANG_SIM_REPLAY_DIR": str(root / "replay")} if args.sim == "replay" else {}
    replay_cmd = [sys.executable, "-S", str(REPLAY)]
    hosts: list[dict[str, Any]] = []
    servers: list[dict[str, Any]] = []
    run_dir_of: dict[str, Path] = {}
    sshds: list[Sshd] = []
    if args.transport == "local":
        sim = make_sim_host(root, gpu_count=n, gpu_total_gib=GPU_GIB, time_scale=args.time_scale)
        run_dir = root / "run"
        hosts.append({
            "name": "sim", "transport": "local",
            "nvidia_smi": [sys.executable, "-m", "launcher.sim.nvidia_smi"],
            "env": {**{k: sim.env[k] for k in ("SGLANG_SIM_HOST", "PYTHONPATH", "no_proxy")},
                    **replay_env},
            "run_dir": str(run_dir),
        })
        for i, name in enumerate(names):
            run_dir_of[name] = run_dir
            servers.append({
                "name": name, "host": "sim", "model_path": model, "tp": 1, "gpus": [i],
                "port": ports[i], "sglang_version": SIM_VERSION, "extra_args": extra,
                "command": (replay_cmd if replay_env
                            else [sys.executable, "-m", "launcher.sim.server"]),
            })
    else:
        h = min(args.hosts, n)
        per_host = math.ceil(n / h)
        sites = []
        try:
            for k in range(h):
                sshd = BenchSshd(root / f"sshd{k}", max_sessions=args.max_sessions or None,
                                 clean_home=args.ssh_home == "clean")
                sshd.start()
                sshds.append(sshd)
                site = Site.create(root, f"gpu{k}", sshd, gpu_count=per_host,
                                   gpu_total_gib=GPU_GIB, time_scale=args.time_scale)
                sites.append(site)
                # The fixture's 2 s keepalive is for tests; a deployment uses the default.
                entry = site.host_entry(keepalive_interval="15s", connect_timeout="10s")
                entry["env"] = {**entry["env"], **replay_env}
                hosts.append(entry)
        except BaseException:
            for started in sshds:
                started.stop()
            raise
        for i, name in enumerate(names):
            site = sites[i % h]
            run_dir_of[name] = site.run_dir
            servers.append(server_entry(name, site, gpus=[i // h], port=ports[i],
                                        extra_args=extra,
                                        **({"command": replay_cmd} if replay_env else {})))
    config = {
        "state_dir": str(root / "state"),
        "policy": policy(args.probe_interval, args.initial),
        "hosts": hosts,
        "servers": servers,
    }
    path = root / "launcher.toml"
    path.write_text(toml_text(config))
    return Rig(root, path, names, run_dir_of, sshds)


# ---------------------------------------------------------------------------------------------
# Child processes and their events


@dataclass(frozen=True)
class Ev:
    """One supervisor event: when it was stamped (wall clock), when it arrived here."""

    wall: float
    arrived: float
    name: str
    server: str
    data: dict[str, Any]


class Child:
    """A launcher (CLI or driver) subprocess in its own session; its stdout JSON lines are
    parsed into events by a thread."""

    def __init__(self, argv: list[str], env: Mapping[str, str], stderr_path: Path) -> None:
        self._err = stderr_path.open("ab")
        self._events_file = stderr_path.with_suffix(".events.jsonl").open("ab")
        self.proc = subprocess.Popen(
            argv, cwd=REPO, env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=self._err, start_new_session=True,
        )
        self.events: list[Ev] = []
        self.other: list[dict[str, Any]] = []
        self.ready: dict[str, int] = {}
        self.gave_up: dict[str, str] = {}
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            now = time.monotonic()
            if b'"probe.result"' not in raw:
                self._events_file.write(raw)
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(obj, dict):
                continue
            name = str(obj.get("event", ""))
            wall = obj.get("ts")
            if wall is None and "timestamp" in obj:
                wall = datetime.fromisoformat(str(obj["timestamp"])).timestamp()
            ev = Ev(float(wall or time.time()), now, name, str(obj.get("server", "")), obj)
            with self._cond:
                if name.startswith("bench."):
                    self.other.append(obj)
                else:
                    self.events.append(ev)
                    if name == "server.ready":
                        self.ready[ev.server] = self.ready.get(ev.server, 0) + 1
                    elif name == "server.gave_up":
                        self.gave_up[ev.server] = str(obj.get("reason", ""))
                self._cond.notify_all()

    def wait(self, pred: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``pred()`` (called under the lock) holds; False on timeout or exit."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not pred():
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._thread.is_alive()):
                    return pred()
                self._cond.wait(min(left, 0.5))
        return True

    def settled(self, n: int) -> bool:
        """Every one of the ``n`` servers is ready or gave up."""
        return len(self.ready) + len(set(self.gave_up) - set(self.ready)) >= n

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (servers keep running), then SIGKILL of its session after ``timeout``."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._thread.join(timeout=5)
        self._err.close()
        self._events_file.close()
        return self.proc.returncode


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("LAUNCHER_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(PYTHONUNBUFFERED="1", NO_COLOR="1", COLUMNS="200")
    return env


# ---------------------------------------------------------------------------------------------
# Measurements


def sim_memory(rig: Rig, sample: int = 10) -> dict[str, float]:
    """RSS and PSS per sim server (its whole process tree), averaged over a few servers."""
    rss: list[float] = []
    pss: list[float] = []
    procs: list[int] = []
    for name in rig.servers[:sample]:
        found = rig.server_pid(name)
        if found is None:
            continue
        tree = proc_tree(found[0])
        procs.append(len(tree))
        rss.append(sum(proc_status(p, "VmRSS") or 0 for p in tree) / 1024)
        pss.append(sum(proc_pss_kb(p) for p in tree) / 1024)
    return {
        "rss_mib_per_server": statistics.mean(rss) if rss else math.nan,
        "pss_mib_per_server": statistics.mean(pss) if pss else math.nan,
        "processes_per_server": statistics.mean(procs) if procs else math.nan,
    }


def steady_state(pid: int, window: float) -> dict[str, float]:
    """The process's CPU share of one core and its RSS over ``window`` seconds."""
    busy0, total0 = host_cpu_ticks()
    cpu0 = proc_cpu_s(pid)
    t0 = time.monotonic()
    rss: list[float] = []
    while time.monotonic() - t0 < window:
        value = proc_status(pid, "VmRSS")
        if value is None:
            break
        rss.append(value / 1024)
        time.sleep(min(1.0, max(0.0, window - (time.monotonic() - t0))))
    cpu1 = proc_cpu_s(pid)
    elapsed = time.monotonic() - t0
    busy1, total1 = host_cpu_ticks()
    if cpu0 is None or cpu1 is None:
        raise RuntimeError("the launcher exited during the steady-state window")
    return {
        "window_s": elapsed,
        "cpu_pct": 100 * (cpu1 - cpu0) / elapsed,
        "rss_mib_end": rss[-1] if rss else math.nan,
        "rss_mib_max": max(rss) if rss else math.nan,
        "rss_mib_peak_hwm": (proc_status(pid, "VmHWM") or 0) / 1024,
        "threads": float(proc_status(pid, "Threads") or 0),
        "fds": float(count_fds(pid)),
        "host_busy_pct": 100 * (busy1 - busy0) / max(1, total1 - total0) * (os.cpu_count() or 1),
    }


def kill_loop(
    child: Child, rig: Rig, kills: int, rng: random.Random, deadline: float,
) -> dict[str, Any]:
    """SIGKILL ready servers one at a time; detection = kill → ``process.died``."""
    victims = rng.sample(rig.servers, min(kills, len(rig.servers)))
    while len(victims) < kills:
        victims.append(rng.choice(rig.servers))
    detect: list[float] = []
    arrival: list[float] = []
    problems: list[str] = []
    for victim in victims:
        if time.monotonic() > deadline:
            problems.append("time budget reached; fewer kills")
            break
        found = rig.server_pid(victim)
        if found is None or not child.ready.get(victim):
            problems.append(f"{victim} not running/ready; skipped")
            continue
        pid, attempt = found
        ready_before = child.ready.get(victim, 0)
        since = time.monotonic()
        t_kill = time.time()
        os.kill(pid, signal.SIGKILL)
        died: list[Ev] = []

        def seen(victim: str = victim, attempt: int = attempt, since: float = since,
                 died: list[Ev] = died) -> bool:
            for ev in reversed(child.events):
                if ev.arrived < since:
                    break
                if (ev.name == "process.died" and ev.server == victim
                        and ev.data.get("attempt") == attempt):
                    died.append(ev)
                    return True
            return False

        if not child.wait(seen, 30.0):
            problems.append(f"{victim}: no process.died within 30 s")
            continue
        detect.append(died[0].wall - t_kill)
        arrival.append(died[0].arrived - since)
        if len(rig.servers) == 1:  # the next kill needs the restarted server

            def back(victim: str = victim, before: int = ready_before) -> bool:
                return child.ready.get(victim, 0) > before

            if not child.wait(back, 90.0):
                problems.append(f"{victim}: not ready again within 90 s")
            time.sleep(rng.uniform(0.3, 1.0))
        else:  # its restart (1 s backoff) overlaps the next kill, as at a real death
            time.sleep(rng.uniform(1.0, 2.0))
    return {
        "kills": len(detect),
        "detect_s": detect,
        "p50_s": percentile(detect, 50),
        "p95_s": percentile(detect, 95),
        "max_s": max(detect) if detect else math.nan,
        "arrival_p95_s": percentile(arrival, 95),
        "problems": problems,
    }


def log_rate(
    child: Child, rig: Rig, ladder: Sequence[int], seconds: float, work: Path, deadline: float,
) -> list[dict[str, Any]]:
    """The writer ladder against server s000's log while the driver supervises all N."""
    target = rig.servers[0]
    d = rig.attempt_dir(target)
    assert d is not None
    log_path = d / "log"
    steps: list[dict[str, Any]] = []
    for rate in ladder:
        if time.monotonic() + seconds + 20 > deadline:
            steps.append({"rate": rate, "skipped": "time budget"})
            break
        cpu0 = proc_cpu_s(child.pid) or 0.0
        t0 = time.monotonic()
        out = work / f"writer-{rate}.json"
        writer = subprocess.run(
            [sys.executable, __file__, "--role", "writer", "--log", str(log_path),
             "--rate", str(rate), "--seconds", str(seconds), "--out", str(out)],
            cwd=REPO, env=child_env(), timeout=seconds + 30, check=True,
        )
        del writer
        wrote = json.loads(out.read_text())

        def done(rate: int = rate) -> bool:
            return any(o.get("event") == "bench.rate_done" and o.get("rate") == rate
                       for o in child.other)

        ok = child.wait(done, 20.0)
        cpu1 = proc_cpu_s(child.pid) or 0.0
        step: dict[str, Any] = {"rate": rate, **wrote,
                                "driver_cpu_pct": 100 * (cpu1 - cpu0) / (time.monotonic() - t0)}
        if not ok:
            step.update(sustained=False, note="end marker not handled within 20 s of the end")
            steps.append(step)
            break
        result = next(o for o in child.other
                      if o.get("event") == "bench.rate_done" and o.get("rate") == rate)
        step.update({k: v for k, v in result.items() if k not in ("event", "rate")})
        step["sustained"] = (step["received"] == wrote["sent"]
                             and step["lag_p99_s"] <= SUSTAINED_P99_S)
        steps.append(step)
        if not step["sustained"]:
            break
        time.sleep(1.0)
    return steps


# ---------------------------------------------------------------------------------------------
# One N


def cli_argv(rig: Rig, *extra: str) -> list[str]:
    return [sys.executable, "-m", "launcher.cli.main", "up", str(rig.config_path),
            "--log-format", "json", *extra]


def batched_ramp(rig: Rig, batch: int, root: Path, deadline: float) -> dict[str, str]:
    """Bring the servers up ``batch`` at a time with ``launcher up -s ... --until-ready``
    (they keep running); the servers that gave up, with the reason."""
    gave_up: dict[str, str] = {}
    for i in range(0, len(rig.servers), batch):
        names = rig.servers[i:i + batch]
        flags = [w for name in names for w in ("-s", name)]
        child = Child(cli_argv(rig, *flags, "--until-ready"), child_env(),
                      root / f"ramp-{i // batch}.stderr")
        def settled(child: Child = child, count: int = len(names)) -> bool:
            return child.settled(count)

        try:
            child.wait(settled,
                       max(30.0, min(120 + 3.0 * len(names), deadline - time.monotonic())))
        finally:
            child.stop()
        gave_up.update({k: v for k, v in child.gave_up.items() if k not in child.ready})
        print(f"    batch {i // batch}: {len(child.ready)}/{len(names)} ready", flush=True)
    return gave_up


def sessions_now(launcher_pid: int, rig: Rig) -> dict[str, float]:
    """What the launcher holds open on the hosts right now. SSH: connections (per-connection
    sshd processes) and exec sessions (commands those run), most on one host; local: the
    launcher's child processes (its followers: ``tail -F`` each, or one agent)."""
    if not rig.sshds:
        return {"sessions": float(len(proc_children(launcher_pid))), "connections": 0.0,
                "sessions_max_host": float(len(proc_children(launcher_pid)))}
    sessions: list[int] = []
    connections = 0
    for sshd in rig.sshds:
        count = 0
        for conn in proc_children(sshd.pid):
            connections += 1
            for pid in proc_tree(conn)[1:]:
                if _comm(pid) != "sshd" and _comm(_ppid(pid)) == "sshd":
                    count += 1
        sessions.append(count)
    return {"sessions": float(sum(sessions)), "connections": float(connections),
            "sessions_max_host": float(max(sessions, default=0))}


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def followers_cpu_s(launcher_pid: int, rig: Rig) -> float:
    """CPU seconds used so far by the host side of the followers: the launcher's children
    (local ``tail -F``) or every sshd process tree (SSH sessions and their ``tail -F``)."""
    if rig.sshds:
        pids = [p for sshd in rig.sshds for p in proc_tree(sshd.pid)]
    else:
        pids = proc_tree(launcher_pid)[1:]
    return sum(proc_cpu_s(p) or 0.0 for p in pids)


def run_one(n: int, args: argparse.Namespace, work: Path, rng: random.Random,
            deadline: float, do_log_rate: bool) -> dict[str, Any]:
    """Ramp, steady state, kills and (optionally) the log-rate ladder for one N."""
    result: dict[str, Any] = {"n": n, "transport": args.transport, "ramp": args.ramp,
                              "sim_kind": args.sim,
                              "hosts": min(args.hosts, n) if args.transport == "ssh" else 1}
    root = work / f"{args.transport}-{n}"
    rig = build_rig(root, n, args)
    children: list[Child] = []
    try:
        t0 = time.monotonic()
        gave_up: dict[str, str] = {}
        if args.ramp == "batched" and n > args.batch:
            gave_up = batched_ramp(rig, args.batch, root, deadline)
        cli = Child(cli_argv(rig), child_env(), root / "launcher.stderr")
        children.append(cli)
        ramp_timeout = args.ramp_timeout or 120 + 1.5 * n
        cli.wait(lambda: cli.settled(n - len(gave_up)), ramp_timeout)
        gave_up.update({k: v for k, v in cli.gave_up.items() if k not in cli.ready})
        result["ramp_s"] = time.monotonic() - t0
        result["ready"] = len(cli.ready)
        result["gave_up"] = gave_up
        print(f"  N={n}: {len(cli.ready)}/{n} ready in {result['ramp_s']:.1f} s"
              + (f", {len(gave_up)} gave up (first: {next(iter(gave_up.values()))[:160]})"
                 if gave_up else ""), flush=True)
        if len(cli.ready) < n:
            result["problem"] = f"only {len(cli.ready)}/{n} ready after {result['ramp_s']:.0f} s"
            if not cli.ready:
                return result
        time.sleep(args.settle)
        result["sim"] = sim_memory(rig)
        result["mem_available_gib"] = mem_available_gib()
        result["loadavg_before"] = os.getloadavg()[0]
        f0 = followers_cpu_s(cli.pid, rig)
        result["steady"] = steady_state(cli.pid, args.window if n > 1 else min(args.window, 20))
        s = result["steady"]
        s["followers_cpu_pct"] = 100 * (followers_cpu_s(cli.pid, rig) - f0) / s["window_s"]
        s.update(sessions_now(cli.pid, rig))
        result["loadavg_after"] = os.getloadavg()[0]
        print(f"  steady: launcher {s['cpu_pct']:.2f}% CPU, RSS {s['rss_mib_end']:.1f} MiB "
              f"(load average {result['loadavg_after']:.1f})", flush=True)
        t1 = time.monotonic()
        result["detect"] = kill_loop(cli, rig, args.kills, rng, deadline)
        result["kill_phase_s"] = time.monotonic() - t1
        det = result["detect"]
        print(f"  detection: p50 {det['p50_s']:.3f} s, p95 {det['p95_s']:.3f} s "
              f"({det['kills']} kills in {result['kill_phase_s']:.0f} s)", flush=True)
        if do_log_rate and time.monotonic() + 60 < deadline:
            cli.stop()
            t1 = time.monotonic()
            driver = Child([sys.executable, __file__, "--role", "driver",
                            "--config", str(rig.config_path)], child_env(),
                           root / "driver.stderr")
            children.append(driver)
            if not driver.wait(lambda: driver.settled(n), 60 + 0.5 * n):
                result["log_rate_problem"] = f"driver: {len(driver.ready)}/{n} ready"
            result["adopt_s"] = time.monotonic() - t1
            time.sleep(2.0)
            ladder = [int(x) for x in args.ladder.split(",")]
            result["log_rate"] = log_rate(driver, rig, ladder, args.rate_seconds, root,
                                          deadline)
            ok = [st["rate"] for st in result["log_rate"] if st.get("sustained")]
            result["max_sustained_lines_s"] = max(ok) if ok else 0
            print(f"  log rate: max sustained {result['max_sustained_lines_s']} lines/s",
                  flush=True)
        return result
    finally:
        for child in reversed(children):
            with contextlib.suppress(Exception):
                child.stop()
        rig.stop()


# ---------------------------------------------------------------------------------------------
# Report


def fmt(x: Any, digits: int = 2) -> str:
    if isinstance(x, float):
        return "-" if math.isnan(x) else f"{x:.{digits}f}"
    return str(x)


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """The tables for each transport in ``results``."""
    parts = []
    for t in ("local", "ssh"):
        mine = [r for r in results if r["transport"] == t]
        if mine:
            parts.append(report_one(mine, args, t))
    return "\n\n".join(parts)


def report_one(results: list[dict[str, Any]], args: argparse.Namespace, t: str) -> str:
    out: list[str] = []
    where = (f"{args.hosts} sshd hosts, MaxSessions "
             f"{args.max_sessions or '10 (stock)'}" if t == "ssh" else "one local host")
    out.append(f"### Steady state ({t}, {where}; probe every {args.probe_interval:g} s, "
               f"{args.window:g} s window; ramp: {args.ramp})\n")
    out.append("| N | ready | ramp s | launcher CPU % of 1 core | RSS MiB end / max | "
               "threads | fds | sessions (most on a host) | SSH connections | "
               "followers CPU % | machine busy % (of 1 core) | load avg | "
               "sim RSS / PSS MiB per server |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        s = r.get("steady")
        if s is None:
            out.append(f"| {r['n']} | {r.get('ready', 0)} | {fmt(r.get('ramp_s', math.nan), 1)}"
                       " | - | - | - | - | - | - | - | - | - | - |")
            continue
        sim = r["sim"]
        out.append(
            f"| {r['n']} | {r['ready']} | {fmt(r['ramp_s'], 1)} | {fmt(s['cpu_pct'])} | "
            f"{fmt(s['rss_mib_end'], 1)} / {fmt(s['rss_mib_max'], 1)} | {s['threads']:.0f} | "
            f"{s['fds']:.0f} | {s.get('sessions', math.nan):.0f} "
            f"({s.get('sessions_max_host', math.nan):.0f}) | {s.get('connections', 0):.0f} | "
            f"{fmt(s.get('followers_cpu_pct', math.nan))} | "
            f"{fmt(s['host_busy_pct'], 0)} | {fmt(r.get('loadavg_after', math.nan), 1)} | "
            f"{fmt(sim['rss_mib_per_server'], 1)} / {fmt(sim['pss_mib_per_server'], 1)} |")
    for r in results:
        if r.get("gave_up"):
            first = next(iter(r["gave_up"].items()))
            out.append(f"\nN={r['n']}: {len(r['gave_up'])} servers gave up during the ramp; "
                       f"first: {first[0]}: {first[1][:300]}")
    out.append(f"\n### Death detection ({t}; SIGKILL → process.died)\n")
    out.append("| N | kills | p50 s | p95 s | max s | p95 − p95(N=1) s |")
    out.append("|---|---|---|---|---|---|")
    base = next((r["detect"]["p95_s"] for r in results if r["n"] == 1 and "detect" in r),
                math.nan)
    for r in results:
        d = r.get("detect")
        if d is None:
            continue
        out.append(f"| {r['n']} | {d['kills']} | {fmt(d['p50_s'], 3)} | {fmt(d['p95_s'], 3)} | "
                   f"{fmt(d['max_s'], 3)} | {fmt(d['p95_s'] - base, 3)} |")
    for r in results:
        if "log_rate" not in r:
            continue
        out.append(f"\n### Log rate into one server's log ({t}, N={r['n']}, "
                   f"{args.rate_seconds:g} s per step; adoption of all N took "
                   f"{fmt(r.get('adopt_s', math.nan), 1)} s)\n")
        out.append("| target lines/s | written lines/s | received / sent | lag p50 s | "
                   "lag p99 s | lag max s | driver CPU % | sustained |")
        out.append("|---|---|---|---|---|---|---|---|")
        for st in r["log_rate"]:
            if "skipped" in st:
                out.append(f"| {st['rate']} | skipped ({st['skipped']}) | | | | | | |")
                continue
            out.append(
                f"| {st['rate']} | {fmt(st.get('achieved', math.nan), 0)} | "
                f"{st.get('received', '-')} / {st.get('sent', '-')} | "
                f"{fmt(st.get('lag_p50_s', math.nan), 3)} | "
                f"{fmt(st.get('lag_p99_s', math.nan), 3)} | "
                f"{fmt(st.get('lag_max_s', math.nan), 3)} | {fmt(st['driver_cpu_pct'], 1)} | "
                f"{'yes' if st.get('sustained') else 'no'} |")
    out.append(f"\n### Targets ({t})\n")
    target_n, target_cpu, target_rss = TARGETS[t]
    for r in results:
        if r["n"] < 2 or "steady" not in r:
            continue
        s, d = r["steady"], r.get("detect", {})
        delta = d.get("p95_s", math.nan) - base
        cpu_ok = s["cpu_pct"] < target_cpu
        rss_ok = s["rss_mib_end"] < target_rss
        det_ok = abs(delta) <= TARGET_DETECT_DELTA_S
        ready_ok = r.get("ready") == r["n"]
        out.append(
            f"- N={r['n']} ({t}): all ready: {'met' if ready_ok else 'MISSED'} "
            f"({r.get('ready')}/{r['n']}); CPU {fmt(s['cpu_pct'])} % < {target_cpu:g} %: "
            f"{'met' if cpu_ok else 'MISSED'}; RSS {fmt(s['rss_mib_end'], 1)} MiB "
            f"< {target_rss:g} MiB: {'met' if rss_ok else 'MISSED'}; detection p95 "
            f"{fmt(d.get('p95_s', math.nan), 3)} s vs {fmt(base, 3)} s at N=1 "
            f"(Δ {fmt(delta, 3)} s, within {TARGET_DETECT_DELTA_S:g} s): "
            f"{'met' if det_ok else 'MISSED'}"
            + ("" if r["n"] >= target_n else f" (the target is for N={target_n})"))
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# The log reader: today's LogFollower against an earlier reader (a copy, below)

# The earlier reader, kept here only to report the ratio: 19 signature searches on every line
# and unguarded start-up searches (launcher/sglang/logparse.py at a46441a).
_OLD_SIGNATURES: tuple[tuple[lp.Signature, re.Pattern[str]], ...] = tuple(
    (sig, re.compile(pattern))
    for sig, pattern in (
        (
            lp.Signature.CUDA_OOM,
            r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory"
            r"|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED",
        ),
        (
            lp.Signature.NCCL_OOM,
            r"Failed to CUDA calloc|NCCL.*\bout of memory|Cuda failure.*out of memory",
        ),
        (
            lp.Signature.KV_TOO_SMALL,
            r"Not enough memory\. Please try to increase --mem-fraction-static"
            r"|Loaded weights leave no GPU memory for the KV cache"
            r"|Memory pool size is too small|max_running_request is zero",
        ),
        (
            lp.Signature.HYBRID_STATE,
            r"Not enough GPU memory for hybrid \(mamba/linear-attention\) state cache"
            r"|Hybrid \(mamba/linear-attention\) state cache is too small",
        ),
        (
            lp.Signature.GRAPH_CAPTURE_FAILED,
            r"(?i:capture\b[^.:]*\bgraph failed)|Fail when using backend: \S+ for \w+ runner",
        ),
        (
            lp.Signature.PORT_IN_USE,
            r"(?i:address already in use)|EADDRINUSE|is not available in \d+ seconds"
            r"|Port is already in use",
        ),
        (
            lp.Signature.BAD_ARGUMENT,
            r"error: (?:unrecognized arguments|ambiguous option"
            r"|the following arguments are required|argument -|invalid choice)"
            r"|User-specified context_length \(\d+\) is greater than the derived context_length"
            r"|is not compatible with (?:radix cache|--)|is incompatible with"
            r"|no_buffer do not support|extra_buffer is not supported for"
            r"|extra_buffer_lazy unsupported",
        ),
        (
            lp.Signature.MODEL_NOT_FOUND,
            r"Repo id must be in the form|We couldn't connect to 'https://huggingface\.co'"
            r"|is not a local folder and is not a valid model identifier|Unrecognized model in"
            r"|does not appear to have a file named config\.json"
            r"|No such file or directory: \S*config\.json|RepositoryNotFoundError",
        ),
        (
            lp.Signature.NCCL_ERROR,
            r"NCCL error|nccl(?:System|Internal|UnhandledCuda|Remote|InvalidUsage|InvalidArgument)"
            r"Error|NCCL WARN|DistBackendError|Watchdog caught collective operation timeout"
            # gloo (the CPU groups): a peer died or the network went; also wrapped by
            # "Capture cuda graph failed: [../third_party/gloo/gloo/transport/tcp/pair.cc:534]"
            r"|/gloo/transport/|\bGloo\b.*(?:failed|timed out)|ProcessGroupGloo",
        ),
        (
            lp.Signature.CUDA_ERROR,
            r"CUDA error: (?!out of memory)|no kernel image is available|illegal memory access"
            r"|device-side assert|CUDA driver version is insufficient|No accelerator \(CUDA"
            r"|no CUDA-capable device|Found no NVIDIA driver|invalid device ordinal"
            r"|unspecified launch failure|CUBLAS_STATUS_(?!ALLOC_FAILED)[A-Z_]+"
            r"|cudaError(?!MemoryAllocation)[A-Z]\w*",
        ),
        (
            lp.Signature.HOST_OOM,
            r"\[Errno 12\] Cannot allocate memory|^MemoryError\b|std::bad_alloc"
            r"|DefaultCPUAllocator: can't allocate memory",
        ),
        (lp.Signature.GPU_BUSY, r"The memory capacity is unbalanced"),
        (lp.Signature.HEALTH_CHECK_FAILED, r"Health check failed"),
        (lp.Signature.WATCHDOG_TIMEOUT, r"[Ww]atchdog timeout \(self\.watchdog_timeout"),
        (lp.Signature.WARMUP_FAILED, r"Initialization failed\. warmup error"),
        (
            lp.Signature.CHILD_FAILED,
            r"Received sigquit from a child process|SIGQUIT received\. signum="
            r"|scheduler is dead|scheduler died during initialization"
            r"|Initialization failed\. Please see the error messages above"
            r"|crashed with exit code|unexpectedly failed with an? exit code"
            r"|kill_process_tree called|^Exit code: -?\d+",
        ),
        (lp.Signature.KILLED, r"^Killed\s*$"),
    )
)


def old_match_signatures(message: str) -> list[lp.Signature]:
    """Every known failure text in one line's message (the part after any prefix).

    "Decode out of memory happened" (a scheduler retracting requests) matches nothing: it is
    normal operation, not a failure. Only the first lp.MAX_KEPT_CHARS are searched: failure
    texts start their line, and a runaway 1 MiB line must not cost the event loop a second.
    """
    head = message[:lp.MAX_KEPT_CHARS]
    return [sig for sig, pattern in _OLD_SIGNATURES if pattern.search(head)]




class OldReader(lp.LogFollower):
    """LogFollower with the line, signature and start-up methods of a46441a (no prefilter)."""

    def _feed(self, line: str) -> list[lp.LogEvent]:
        line_no = self.line_count
        self.line_count += 1
        parsed = lp.parse_line(line)
        events: list[lp.LogEvent] = []
        role = lp._Role.OUTSIDE
        if self._tb is not None:
            role, closed = self._tb_step(parsed)
            if closed is not None:
                events.append(closed)
        if role is lp._Role.OUTSIDE and parsed.message.endswith(lp._TB_HEADER):
            if self._tb is not None:  # a header while one is open: the first was cut short
                events.append(self._tb.close())
            self._tb = lp._OpenTraceback(
                line_no=line_no, header=lp._kept(line), rank=parsed.rank,
                phase=self.phase_of(parsed.rank),
            )
            role = lp._Role.TEXT
        if role is not lp._Role.FRAME:
            events.extend(self._signatures(parsed, line_no, in_traceback=role is lp._Role.TEXT))
            if role is lp._Role.OUTSIDE:
                events.extend(self._startup(parsed, line_no))
        self._record(events)
        return events

    def _signatures(
        self, p: lp.ParsedLine, line_no: int, *, in_traceback: bool
    ) -> list[lp.FailureSignature]:
        kinds = old_match_signatures(p.message)
        if not kinds:
            return []
        if in_traceback and self._tb is not None:
            self._tb.signatures.update(kinds)
            rank, phase = self._tb.rank, self._tb.phase
        else:
            rank, phase = p.rank, self.phase_of(p.rank)
        if lp.Signature.CUDA_OOM in kinds or lp.Signature.KV_TOO_SMALL in kinds:
            lp.fill_error_figures(self.numbers, p.message[:lp.MAX_KEPT_CHARS], overwrite=False)
        if p.source is not lp.Source.BARE and lp.Signature.KILLED in kinds:
            kinds.remove(lp.Signature.KILLED)  # only a shell's own bare line means that
        return [lp.FailureSignature(kind, lp._kept(p.raw), line_no, rank, phase, in_traceback)
                for kind in kinds]

    # -- start-up progress -----------------------------------------------------------------

    def _startup(self, p: lp.ParsedLine, line_no: int) -> list[lp.LogEvent]:
        # Progress lines are short; only the args dump can be long (and is read whole).
        msg = p.message if p.message.startswith("server_args=") else p.message[:lp.MAX_KEPT_CHARS]
        events: list[lp.LogEvent] = []
        rank = p.rank

        def enter(phase: Phase) -> None:
            events.extend(self._enter(phase, rank))

        def figure(name: lp.Figure, value: str) -> None:
            events.append(self._figure(name, float(value), rank))

        if p.source is lp.Source.UVICORN:
            if lp._HTTP_UP.match(msg):
                enter(Phase.WARMUP)
            return events
        if p.source is lp.Source.BARE:
            return self._bars(msg)
        if msg.startswith(lp.READY_TEXT):
            enter(Phase.READY)
            if self.ready_line_no is None:
                self.ready_line_no, self.ready_line = line_no, lp._kept(p.raw)
            events.append(lp.ReadyLine(lp._kept(p.raw), line_no))
        elif lp._INIT_MARK.match(msg):
            enter(Phase.INIT)
            if msg.startswith("server_args="):
                self._args_dump(msg)
            elif m := lp._DIST_USAGE.match(msg):
                figure(lp.Figure.DIST_INIT_USAGE, m.group(1))
        elif m := lp._BASELINE.match(msg):
            figure(lp.Figure.BASELINE_USAGE, m.group(1))
        elif m := lp._WEIGHT_BEGIN.search(msg):
            enter(Phase.WEIGHTS)
            figure(lp.Figure.WEIGHT_BEGIN_AVAIL, m.group(1))
        elif m := lp._WEIGHT_END.search(msg):
            kind = lp._WEIGHT_TYPE.search(msg)
            if kind is not None and lp._DRAFT_TYPE.search(kind.group(1)):
                # The draft model (speculative decoding): not a second target.
                self._draft_weights[rank or ""] = float(m.group(2))
                self.numbers.draft_weights_gib = max(self._draft_weights.values())
            else:
                enter(Phase.KV_CACHE)
                figure(lp.Figure.WEIGHT_END_AVAIL, m.group(1))
                figure(lp.Figure.WEIGHT_END_USAGE, m.group(2))
        elif lp._KV_MARK.search(msg):
            enter(Phase.KV_CACHE)
            if (m := lp._MAMBA_ALLOC.search(msg)) and self.numbers.mamba_cache_size is None:
                self.numbers.mamba_cache_size = int(m.group(1))
                self.numbers.mamba_state_gib = round(
                    sum(float(v) for v in m.groups()[1:] if v is not None), 2
                )
            if m := lp._KV_ALLOC.search(msg):
                if self.numbers.kv_tokens is None:
                    self.numbers.kv_tokens = int(m.group(1))
                sizes = zip(
                    (lp.Figure.KV_K_SIZE, lp.Figure.KV_V_SIZE, lp.Figure.KV_SIZE),
                    m.groups()[1:],
                    strict=True,
                )
                for name, value in sizes:
                    if value is not None:
                        figure(name, value)
            elif m := lp._POOL_END.match(msg):
                figure(lp.Figure.POOL_END_AVAIL, m.group(1))
        elif lp._GRAPH_BEGIN.match(msg):
            enter(Phase.CUDA_GRAPH)
            avail = lp._AVAIL.search(msg)
            self._begin_pass(msg, rank, float(avail.group(1)) if avail else None)
            if avail is not None:
                figure(lp.Figure.GRAPH_BEGIN_AVAIL, avail.group(1))
        elif m := lp._SPEC_RESET.match(msg):
            if self.numbers.max_running_requests is None:
                self.numbers.max_running_requests = int(m.group(1))
        elif m := lp._GRAPH_END.match(msg):
            figure(lp.Figure.GRAPH_END_USAGE, m.group(1))
            figure(lp.Figure.GRAPH_END_AVAIL, m.group(2))
        elif m := lp._SUMMARY.match(msg):
            enter(Phase.WARMUP)
            self.numbers.max_total_num_tokens = int(m.group(1))
            figure(lp.Figure.SUMMARY_AVAIL, m.group(2))
        return events



def reader_corpus(steady_lines: int) -> list[str]:
    """A real ready start-up (verbatim fixture) followed by ``steady_lines`` lines of a
    serving server: decode and prefill statistics and access lines, as SGLang 0.5.x prints
    them."""
    start = (REPO / "tests/fixtures/real_logs/gh4127_ready_then_check_memory_attributeerror.log")
    lines = lp.split_records(start.read_text("utf-8", errors="replace"))
    lines = lines[:next(i for i, x in enumerate(lines) if "fired up" in x) + 1]
    for i in range(steady_lines):
        k = i % 10
        if k < 6:
            lines.append(f"[2026-12-01 18:00:{i % 60:02d} TP0] Decode batch, #running-req: "
                         f"{i % 64}, #token: {4096 + i % 977}, token usage: 0.05, cuda graph: "
                         f"True, gen throughput (token/s): 1234.56, #queue-req: 0,")
        elif k < 7:
            lines.append(f"[2026-12-01 18:00:{i % 60:02d} TP0] Prefill batch, #new-seq: 1, "
                         f"#new-token: {i % 2048}, #cached-token: 0, token usage: 0.05, "
                         "#running-req: 12, #queue-req: 0,")
        else:
            lines.append(f'[2026-12-01 18:00:{i % 60:02d}] INFO:     127.0.0.1:{40000 + k} - '
                         '"POST /generate HTTP/1.1" 200 OK')
    return lines


def reader_bench(steady_lines: int, rounds: int = 3) -> dict[str, float]:
    """Lines per CPU-second of each reader on the same corpus (best of ``rounds``, the two
    alternating), and whether both saw the same events."""
    lines = reader_corpus(steady_lines)
    best = {"new": 0.0, "old": 0.0}
    events: dict[str, int] = {}
    for _ in range(rounds):
        for name, cls in (("new", lp.LogFollower), ("old", OldReader)):
            reader = cls()
            t0 = time.process_time()
            count = 0
            for line in lines:
                count += len(reader.feed_line(line))
            spent = time.process_time() - t0
            best[name] = max(best[name], len(lines) / spent)
            events[name] = count
    return {"lines": float(len(lines)), "new_lines_s": best["new"],
            "old_lines_s": best["old"], "ratio": best["new"] / best["old"],
            "same_events": float(events["new"] == events["old"])}


# ---------------------------------------------------------------------------------------------
# The scaling plot


def scaling_svg(results: list[dict[str, Any]]) -> str:
    """Three panels (launcher CPU %, RSS MiB, sessions held on the busiest host) against N on
    a log axis, one line per transport; plain SVG, no plotting library."""
    panels = [("launcher CPU, % of one core", lambda r: r["steady"]["cpu_pct"]),
              ("launcher RSS, MiB", lambda r: r["steady"]["rss_mib_end"]),
              ("sessions on the busiest host", lambda r: r["steady"].get("sessions_max_host",
                                                                        math.nan))]
    colors = {"local": "#1f77b4", "ssh": "#d62728"}
    w, h, pad_l, pad_b, gap = 300, 220, 50, 40, 30
    width = len(panels) * (w + pad_l + gap) + 20
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h + pad_b + 60}" '
           'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{h + pad_b + 60}" fill="white"/>']
    ns = [r["n"] for r in results]
    lo, hi = math.log10(min(ns)), math.log10(max(max(ns), 2))
    for k, (title, value) in enumerate(panels):
        x0, y0 = 10 + k * (w + pad_l + gap) + pad_l, 30
        vals = [value(r) for r in results if not math.isnan(value(r))]
        top = max(vals, default=1.0) * 1.15 or 1.0

        def px(n: float, x0: float = x0) -> float:
            return x0 + (math.log10(n) - lo) / max(hi - lo, 1e-9) * w

        def py(v: float, y0: float = y0, top: float = top) -> float:
            return y0 + h - v / top * h

        out.append(f'<text x="{x0 + w / 2}" y="18" text-anchor="middle" '
                   f'font-weight="bold">{title}</text>')
        out.append(f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" '
                   'stroke="#888"/>')
        for i in range(5):
            v = top * i / 4
            out.append(f'<text x="{x0 - 4}" y="{py(v) + 4:.1f}" text-anchor="end">'
                       f'{v:.3g}</text>')
            out.append(f'<line x1="{x0}" x2="{x0 + w}" y1="{py(v):.1f}" y2="{py(v):.1f}" '
                       'stroke="#eee"/>')
        for n in sorted(set(ns)):
            out.append(f'<text x="{px(n):.1f}" y="{y0 + h + 14}" text-anchor="middle">{n}'
                       '</text>')
        out.append(f'<text x="{x0 + w / 2}" y="{y0 + h + 30}" text-anchor="middle">'
                   'servers supervised (N, log scale)</text>')
        for t, color in colors.items():
            pts = sorted((r["n"], value(r)) for r in results if r["transport"] == t)
            pts = [(n, v) for n, v in pts if not math.isnan(v)]
            if not pts:
                continue
            path = " ".join(f"{px(n):.1f},{py(v):.1f}" for n, v in pts)
            out.append(f'<polyline points="{path}" fill="none" stroke="{color}" '
                       'stroke-width="2"/>')
            for n, v in pts:
                out.append(f'<circle cx="{px(n):.1f}" cy="{py(v):.1f}" r="3" fill="{color}"/>')
    for i, (t, color) in enumerate(colors.items()):
        label = ("local transport" if t == "local"
                 else "SSH (stock sshd, MaxSessions 10; hosts as in the run)")
        out.append(f'<rect x="{60 + i * 260}" y="{h + pad_b + 38}" width="12" height="4" '
                   f'fill="{color}"/><text x="{78 + i * 260}" y="{h + pad_b + 44}">{label}'
                   '</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# Roles: writer and driver


def writer_main(args: argparse.Namespace) -> int:
    """Append stamped SGLang decode lines to ``--log`` at ``--rate`` lines/s for
    ``--seconds``, then an end line; write {"sent", "achieved"} to ``--out``."""
    rate, seconds = int(args.rate), float(args.seconds)
    fd = os.open(args.log, os.O_WRONLY | os.O_APPEND)
    head = time.strftime("[%Y-%m-%d %H:%M:%S TP0] ")
    body = ("Decode batch, #running-req: 32, #token: 4096, token usage: 0.05, cuda graph: True, "
            "gen throughput (token/s): 1234.56, #queue-req: 0,")
    sent = 0
    t0 = time.monotonic()
    try:
        while True:
            now = time.monotonic()
            elapsed = now - t0
            if elapsed >= seconds:
                break
            due = min(int(elapsed * rate) + 1, int(seconds * rate)) - sent
            if due > 0:
                stamp = f"{time.monotonic():.6f}"
                chunk = "".join(
                    f"{head}{body}{BENCH_MARK}{rate} bench_s={sent + i} bench_t={stamp}\n"
                    for i in range(due)
                )
                os.write(fd, chunk.encode())
                sent += due
            time.sleep(0.002)
        elapsed = time.monotonic() - t0
        os.write(fd, f"{head}{END_MARK}bench_r={rate} bench_n={sent}\n".encode())
    finally:
        os.close(fd)
    Path(args.out).write_text(json.dumps({"sent": sent, "achieved": sent / elapsed}))
    return 0


class LagTracker:
    """Per rate: write-to-line lag of every stamped line the follower handed over."""

    def __init__(self, emit: Callable[[dict[str, Any]], None]) -> None:
        self.emit = emit
        self.lags: dict[int, list[float]] = {}

    def observe(self, line: str) -> None:
        if BENCH_MARK in line and END_MARK not in line:
            now = time.monotonic()
            tail = line.rpartition(BENCH_MARK)[2].split()
            rate = int(tail[0])
            sent_at = float(tail[2].partition("=")[2])
            self.lags.setdefault(rate, []).append(now - sent_at)
        elif END_MARK in line:
            fields = dict(f.split("=", 1) for f in line.rpartition(END_MARK)[2].split())
            rate = int(fields["bench_r"])
            lags = self.lags.pop(rate, [])
            quarter = max(1, len(lags) // 4)
            self.emit({
                "event": "bench.rate_done", "rate": rate, "received": len(lags),
                "lag_p50_s": percentile(lags, 50), "lag_p99_s": percentile(lags, 99),
                "lag_max_s": max(lags) if lags else math.nan,
                "lag_first_quarter_mean_s": statistics.mean(lags[:quarter]) if lags else math.nan,
                "lag_last_quarter_mean_s": statistics.mean(lags[-quarter:]) if lags else math.nan,
            })


def driver_main(args: argparse.Namespace) -> int:
    """``launcher up`` minus the ledger and the live view, with one observing subclass."""
    import anyio

    from launcher.config.load import load_config
    from launcher.config.placeholders import expand_placeholders
    from launcher.hooks.logging import configure
    from launcher.host.transport import make_transport
    from launcher.host.transport.local import install_pidfd_child_watcher
    from launcher.supervise.lifecycle import State
    from launcher.supervise.supervisor import RunningAttempt, ServerSupervisor, supervise_all

    out: IO[str] = sys.stdout
    lock = threading.Lock()

    def emit(obj: dict[str, Any]) -> None:
        with lock:
            out.write(json.dumps(obj, default=str) + "\n")
            out.flush()

    tracker = LagTracker(emit)

    class Observed(ServerSupervisor):
        async def _on_line(self, att: RunningAttempt, line: str) -> None:
            await super()._on_line(att, line)
            tracker.observe(line)

    def hook(server: str, event: events.Event) -> None:
        if not isinstance(event, events.Probed):
            emit({"event": event.name, "server": server, "ts": time.time(), **event.to_dict()})

    configure("json", stream=sys.stderr)
    config_path = Path(args.config)
    config = expand_placeholders(load_config(config_path, environ={}), config_path)

    async def main() -> None:
        install_pidfd_child_watcher()  # as launcher up does
        transports = {s.host: make_transport(config.host(s.host)) for s in config.servers}
        sups: list[ServerSupervisor] = [
            Observed(config, s, transports[s.host], sglang_version=s.sglang_version or "",
                     hooks=[hook])
            for s in config.servers
        ]
        try:
            async with anyio.create_task_group() as tg:

                async def on_signal() -> None:
                    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                        async for _ in signals:
                            for sup in sups:
                                sup.request_stop(kill=False)
                            return

                tg.start_soon(on_signal)
                states = await supervise_all(sups)
                tg.cancel_scope.cancel()
            emit({"event": "bench.driver_done",
                  "gave_up": sum(st is State.GAVE_UP for st in states.values())})
        finally:
            with anyio.CancelScope(shield=True):
                for t in transports.values():
                    await t.aclose()

    anyio.run(main)
    return 0


# ---------------------------------------------------------------------------------------------
# Main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--servers", default="50,100,200", help="comma-separated N values")
    p.add_argument("--transport", choices=("local", "ssh", "both"), default="both")
    p.add_argument("--local-servers", default=None,
                   help="N values for the local transport with --transport both "
                   "(default: --servers)")
    p.add_argument("--reader-lines", type=int, default=100_000,
                   help="steady-state lines for the log reader comparison (0: skip)")
    p.add_argument("--plot", type=Path, default=REPO / "docs" / "bench_scale.svg",
                   help="write the scaling plot (SVG) here")
    p.add_argument("--hosts", type=int, default=2, help="sshd hosts for --transport ssh")
    p.add_argument("--max-sessions", type=int, default=0,  # 0: stock sshd (MaxSessions 10)
                   help="sshd MaxSessions (default: servers per host + 64; OpenSSH's own is 10)")
    p.add_argument("--ssh-home", choices=("clean", "user"), default="clean",
                   help="clean: sessions get an empty HOME (no ~/.bashrc); user: the real one")
    p.add_argument("--probe-interval", type=float, default=10.0)
    p.add_argument("--settle", type=float, default=15.0,
                   help="seconds between all-ready and the steady-state window")
    p.add_argument("--window", type=float, default=60.0, help="steady-state window, seconds")
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--log-rate-at", default="max",
                   help="'max' (largest N), 'all', 'none' or a comma-separated list of N")
    p.add_argument("--ladder", default=DEFAULT_LADDER, help="log-rate steps, lines/s")
    p.add_argument("--rate-seconds", type=float, default=4.0)
    p.add_argument("--time-scale", type=float, default=0.003)
    p.add_argument("--ramp", choices=("all", "batched"), default="all",
                   help="all: one `launcher up` starts every server at once; batched: "
                   "`launcher up -s ... --until-ready` per --batch servers first, then one "
                   "`launcher up` adopts them all")
    p.add_argument("--batch", type=int, default=25)
    p.add_argument("--ramp-timeout", type=float, default=0.0,
                   help="seconds to wait for all ready (default 120 + 1.5 s per server); "
                   "the estimate runs one server after the other before any launch, "
                   "~1.7 s each over SSH on this machine")
    p.add_argument("--skip-warmup", action="store_true",
                   help="pass --skip-server-warmup to the sims (lighter start-up)")
    p.add_argument("--sim", choices=("real", "replay"), default="real",
                   help="real: launcher.sim.server (3 Python processes, ~28 MiB PSS each "
                   "server); replay: launcher/sim/replay.py, one lean process replaying a "
                   "recorded start-up of the real sim (~4 MiB)")
    p.add_argument("--initial", choices=("auto", "configured"), default="auto",
                   help="the policy's `initial`: configured skips the per-server memory "
                   "estimate before the launches (a shorter ramp at large N)")
    p.add_argument("--min-available-gib", type=float, default=10.0,
                   help="do not start an N while MemAvailable is below this")
    p.add_argument("--no-baseline", action="store_true", help="skip the N=1 baseline")
    p.add_argument("--budget-minutes", type=float, default=15.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument("--workdir", type=Path, default=None, help="keep the sim dirs here")
    p.add_argument("--role", choices=("bench", "driver", "writer"), default="bench",
                   help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--log", help=argparse.SUPPRESS)
    p.add_argument("--rate", help=argparse.SUPPRESS)
    p.add_argument("--seconds", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def fits(n: int, per_server_mib: float) -> bool:
    """Whether N sims (plus a launcher) fit in 80 % of what the machine has free."""
    return n * per_server_mib / 1024 + 0.5 < 0.8 * mem_available_gib()


@contextlib.contextmanager
def terminated_as_exit() -> Iterator[None]:
    """SIGTERM / SIGHUP raise SystemExit, so the finally blocks clean up."""
    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role == "writer":
        return writer_main(args)
    if args.role == "driver":
        return driver_main(args)
    def sizes(text: str) -> list[int]:
        ns = sorted({int(x) for x in text.split(",") if x.strip()})
        return ns if args.no_baseline or 1 in ns else [1, *ns]

    plan: list[tuple[str, list[int]]] = []
    if args.transport in ("local", "both"):
        plan.append(("local", sizes(args.local_servers or args.servers)))
    if args.transport in ("ssh", "both"):
        plan.append(("ssh", sizes(args.servers)))
    deadline = time.monotonic() + args.budget_minutes * 60
    rng = random.Random(args.seed)
    results: list[dict[str, Any]] = []
    reader: dict[str, float] | None = None
    # Until measured: three Python processes, a shell, a tail (replay: one lean process).
    per_server_mib = 60.0 if args.sim == "real" else 12.0
    with terminated_as_exit(), contextlib.ExitStack() as stack:
        if args.workdir is None:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-scale-")))
        else:
            work = args.workdir
            work.mkdir(parents=True, exist_ok=True)
        print(f"bench_scale: plan={plan} work={work} "
              f"MemAvailable={mem_available_gib():.1f} GiB cores={os.cpu_count()} "
              f"load={os.getloadavg()[0]:.1f}", flush=True)
        if args.reader_lines:
            reader = reader_bench(args.reader_lines)
            print(f"log reader: {reader['new_lines_s']:.0f} lines/s, the old reader (a46441a) "
                  f"{reader['old_lines_s']:.0f} lines/s (x{reader['ratio']:.1f})", flush=True)
        for transport, ns in plan:
            args.transport = transport
            if args.log_rate_at == "max":
                rate_at = {max(ns)} if transport == "local" else set()
            elif args.log_rate_at == "all":
                rate_at = set(ns)
            elif args.log_rate_at == "none":
                rate_at = set()
            else:
                rate_at = {int(x) for x in args.log_rate_at.split(",")}
            for n in ns:
                if time.monotonic() + 60 > deadline:
                    print(f"N={n}: skipped, time budget spent", flush=True)
                    results.append({"n": n, "transport": transport, "skipped": "time budget"})
                    continue
                if mem_available_gib() < args.min_available_gib:
                    print(f"N={n}: skipped, {mem_available_gib():.1f} GiB available, under "
                          f"--min-available-gib {args.min_available_gib:g}", flush=True)
                    results.append({"n": n, "transport": transport, "skipped": "memory"})
                    continue
                if not fits(n, per_server_mib):
                    print(f"N={n}: skipped, {n} × {per_server_mib:.0f} MiB does not fit in "
                          f"80 % of {mem_available_gib():.1f} GiB available", flush=True)
                    results.append({"n": n, "transport": transport, "skipped": "memory"})
                    continue
                print(f"N={n} ({transport}) ...", flush=True)
                result = run_one(n, args, work, rng, deadline, n in rate_at)
                results.append(result)
                # PSS: the sims share their interpreter's pages (RSS counts them N times).
                measured = result.get("sim", {}).get("pss_mib_per_server", math.nan)
                if not math.isnan(measured):
                    per_server_mib = measured + 6  # + wrapper shell
    args.transport = "both"
    text = report([r for r in results if "skipped" not in r], args)
    if reader is not None:
        text += (f"\n\n### Log reader (one core, {reader['lines']:.0f} lines: a real start-up, "
                 "then decode / prefill statistics and access lines)\n\n"
                 f"- today's reader: {reader['new_lines_s']:.0f} lines/s; a46441a's reader: "
                 f"{reader['old_lines_s']:.0f} lines/s; ratio x{reader['ratio']:.2f}; same "
                 f"events: {'yes' if reader['same_events'] else 'NO'}\n"
                 f"- target >= {TARGET_READER_LINES_S} lines/s: "
                 f"{'met' if reader['new_lines_s'] >= TARGET_READER_LINES_S else 'MISSED'}")
    measured = [r for r in results if "steady" in r]
    if args.plot is not None and measured:
        args.plot.write_text(scaling_svg(measured))
        text += f"\n\nPlot: {args.plot}"
    skipped = [r for r in results if "skipped" in r]
    if skipped:
        text += "\n" + "\n".join(f"- N={r['n']} skipped: {r['skipped']}" for r in skipped)
    print("\n" + text)
    if args.json is not None:
        args.json.write_text(json.dumps({"results": results, "reader": reader}, indent=1,
                                        default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

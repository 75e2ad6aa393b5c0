"""Simulated GPU occupancy of one sim host, shared between processes through files.

The host is a JSON file named by ``SGLANG_SIM_HOST``::

    {"gpu_count": 8, "gpu_total_gib": 79.19, "gpu_name": "NVIDIA H100 80GB HBM3",
     "state_dir": "state", "time_scale": 0.02, "foreign_used_gib": {"3": 20.0}}

``state_dir`` is relative to the JSON file's directory unless absolute. ``foreign_used_gib`` is
memory held for ever by a process that is not a sim server (reported with pid ``FOREIGN_PID``).

Who holds memory: as in SGLang, the scheduler processes do, one per GPU. A sim server spawns
one cheap *holder* child per rank (``sglang::scheduler_TPn``, see :func:`hold_main`) and records
each holder's usage in ``state_dir/<server pid>.json``, rewritten atomically as it allocates.
A holder's memory counts while that process is alive (checked through ``/proc``, with its start
time against pid reuse), so memory is released exactly when the process goes:

- normally a holder sets ``PR_SET_PDEATHSIG=SIGKILL`` and dies with its server;
- with an ``orphan_hold_s`` fault it instead outlives a dead server by that many seconds
  (a scheduler stuck in a driver call), ignoring SIGTERM: an orphan still holding memory.

Readers (:func:`processes`, :func:`used_by_gpu`) delete files whose holders are all gone.
This module imports only the standard library: holders import it at start-up.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

FOREIGN_PID = 424242  # the fake pid nvidia-smi shows for foreign_used_gib
FOREIGN_NAME = "/usr/bin/python3"
ENV_HOST = "SGLANG_SIM_HOST"
ENV_TIME_SCALE = "SGLANG_SIM_TIME_SCALE"

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


class HostConfigError(ValueError):
    """The sim host file is missing or invalid; the message names the file and the problem."""


@dataclass(frozen=True)
class SimGpuHost:
    """One simulated GPU host."""

    path: Path
    gpu_count: int
    gpu_total_gib: float
    gpu_name: str
    state_dir: Path
    time_scale: float
    foreign_used_gib: Mapping[int, float]
    # The address this host's own 127.0.0.1 stands for when a server binds it: two sim hosts
    # on one machine (a multi-node test) bind their HTTP ports apart (e.g. 127.0.0.2).
    loopback: str | None = None

    @classmethod
    def load(cls, path: Path, environ: Mapping[str, str] | None = None) -> SimGpuHost:
        """Read a host file; ``SGLANG_SIM_TIME_SCALE`` in ``environ`` overrides time_scale.

        Raises HostConfigError naming the file for anything unreadable or out of range."""
        env = os.environ if environ is None else environ
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise HostConfigError(f"{path}: cannot read sim host file: {exc}") from exc
        if not isinstance(data, dict):
            raise HostConfigError(f"{path}: sim host file must hold a JSON object")
        try:
            gpu_count = int(data.get("gpu_count", 8))
            total = float(data.get("gpu_total_gib", 79.19))
            name = str(data.get("gpu_name", "NVIDIA H100 80GB HBM3"))
            state = Path(str(data.get("state_dir", "state")))
            scale = float(env.get(ENV_TIME_SCALE) or data.get("time_scale", 0.02))
            foreign = {int(k): float(v) for k, v in dict(data.get("foreign_used_gib", {})).items()}
        except (TypeError, ValueError) as exc:
            raise HostConfigError(f"{path}: bad value in sim host file: {exc}") from exc
        if gpu_count < 1 or total <= 0 or scale < 0:
            raise HostConfigError(
                f"{path}: need gpu_count >= 1, gpu_total_gib > 0 and time_scale >= 0"
            )
        if any(not 0 <= gpu < gpu_count or gib < 0 for gpu, gib in foreign.items()):
            raise HostConfigError(
                f"{path}: foreign_used_gib names a GPU outside 0..{gpu_count - 1}"
            )
        if not state.is_absolute():
            state = path.resolve().parent / state
        loopback = data.get("loopback")
        return cls(path, gpu_count, total, name, state, scale, foreign,
                   str(loopback) if loopback else None)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SimGpuHost | None:
        """The host named by ``SGLANG_SIM_HOST``, or None when it is unset (no GPU at all)."""
        env = os.environ if environ is None else environ
        value = env.get(ENV_HOST)
        return cls.load(Path(value), env) if value else None

    @property
    def gpu_total_mib(self) -> int:
        return round(self.gpu_total_gib * 1024)


@dataclass(frozen=True)
class Holder:
    """A process that holds memory on one GPU (a scheduler child of a sim server)."""

    pid: int
    start: int  # /proc/<pid>/stat starttime, against pid reuse
    gpu: int  # physical index on the host
    name: str


@dataclass(frozen=True)
class GpuProcess:
    """One row of ``nvidia-smi --query-compute-apps``."""

    pid: int
    gpu: int
    used_gib: float
    name: str
    server_pid: int | None = None  # the sim server that spawned it; None for foreign memory


def proc_start_time(pid: int) -> int | None:
    """The start time of a live (not zombie) process, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    if not fields or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _alive(pid: int, start: int) -> bool:
    return proc_start_time(pid) == start


class Registration:
    """One sim server's GPU memory, per holder, in ``state_dir/<server_pid>.json``.

    Resource handling: :meth:`update` rewrites the file atomically (write + rename), so a
    reader never sees half a file; :meth:`release` deletes it. A server killed without
    releasing leaves the file to readers, who drop it once its holders are dead.
    """

    def __init__(self, host: SimGpuHost, server_pid: int, holders: Sequence[Holder]) -> None:
        self.host = host
        self.server_pid = server_pid
        self.holders = list(holders)
        self.path = host.state_dir / f"{server_pid}.json"
        host.state_dir.mkdir(parents=True, exist_ok=True)

    def update(self, used_gib: Mapping[int, float]) -> None:
        """Record ``used_gib`` per physical GPU (each holder's GPU)."""
        body = {
            "server_pid": self.server_pid,
            "updated": time.time(),
            "holders": [
                {
                    "pid": h.pid,
                    "start": h.start,
                    "gpu": h.gpu,
                    "name": h.name,
                    "used_gib": float(used_gib.get(h.gpu, 0.0)),
                }
                for h in self.holders
            ],
        }
        tmp = self.path.with_suffix(f".tmp{os.getpid()}-{threading.get_ident()}")
        tmp.write_text(json.dumps(body))
        os.replace(tmp, self.path)

    def release(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def processes(host: SimGpuHost, *, exclude_server: int | None = None) -> list[GpuProcess]:
    """Every process holding memory on the host now: the foreign holder, then live holders of
    sim servers (orphans included). Files of servers whose holders are all dead are deleted."""
    found = [
        GpuProcess(FOREIGN_PID, gpu, gib, FOREIGN_NAME)
        for gpu, gib in sorted(host.foreign_used_gib.items())
        if gib > 0
    ]
    if not host.state_dir.is_dir():
        return found
    for path in sorted(host.state_dir.glob("*.json")):
        try:
            body = json.loads(path.read_text())
            server_pid = int(body["server_pid"])
            rows = [
                (
                    int(h["pid"]),
                    int(h["start"]),
                    int(h["gpu"]),
                    float(h["used_gib"]),
                    str(h["name"]),
                )
                for h in body["holders"]
            ]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being replaced, or not ours
        live = [r for r in rows if _alive(r[0], r[1])]
        if not live and proc_start_time(server_pid) is None:
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        if server_pid == exclude_server:
            continue
        found.extend(
            GpuProcess(pid, gpu, used, name, server_pid)
            for pid, _start, gpu, used, name in live
            if 0 <= gpu < host.gpu_count
        )
    return found


def used_by_gpu(host: SimGpuHost, *, exclude_server: int | None = None) -> list[float]:
    """GiB held per GPU (index = physical GPU) by everyone except ``exclude_server``."""
    used = [0.0] * host.gpu_count
    for p in processes(host, exclude_server=exclude_server):
        used[p.gpu] += p.used_gib
    return used


def visible_devices(host: SimGpuHost, environ: Mapping[str, str]) -> list[int]:
    """Physical GPUs in CUDA_VISIBLE_DEVICES order; like CUDA, the list stops at the first
    entry that is not a valid index. Unset: every GPU."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return list(range(host.gpu_count))
    out: list[int] = []
    for item in value.split(","):
        item = item.strip()
        if not item.isdigit() or int(item) >= host.gpu_count:
            break
        out.append(int(item))
    return out


# ---------------------------------------------------------------------------------------------
# Holder processes


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def set_process_name(name: str) -> None:
    """``prctl(PR_SET_NAME)``: what ``ps -o comm`` shows (first 15 bytes). Best effort."""
    with contextlib.suppress(OSError, AttributeError):
        _libc().prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def set_parent_death_signal(sig: int) -> None:
    """``prctl(PR_SET_PDEATHSIG, sig)``, SGLang's ``kill_itself_when_parent_died``."""
    with contextlib.suppress(OSError, AttributeError):
        _libc().prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)


def spawn_holder(name: str, *, hold_s: float) -> subprocess.Popen[bytes]:
    """Start a holder child whose command line reads ``name`` (``ps -o cmd`` shows
    ``sglang::scheduler_TP0 -S -c ...``, so it does not match the server's command line).

    It dies with its parent, or outlives it by ``hold_s`` seconds when ``hold_s > 0``."""
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    env["SGLANG_SIM_HOLDER"] = json.dumps({"name": name, "parent": os.getpid(), "hold_s": hold_s})
    return subprocess.Popen(
        [name, "-S", "-c", "import launcher.sim.gpustate as g; g.hold_main()"],
        executable=sys.executable,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def holder_of(proc: subprocess.Popen[bytes], gpu: int, name: str) -> Holder:
    start = proc_start_time(proc.pid)
    return Holder(proc.pid, -1 if start is None else start, gpu, name)


def hold_main() -> None:
    """Entry point of a holder child: wait for the parent's death (or a signal), then exit."""
    spec = json.loads(os.environ["SGLANG_SIM_HOLDER"])
    parent = int(spec["parent"])
    hold_s = float(spec["hold_s"])
    set_process_name(str(spec["name"]))
    if hold_s <= 0:
        set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(0)
        while True:
            signal.pause()
    # Orphan mode: a scheduler stuck in the driver. SIGTERM stays pending; SIGKILL still works.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while os.getppid() == parent:
        time.sleep(0.02)
    time.sleep(hold_s)
    os._exit(0)

"""Test helpers for a simulated SGLang GPU host (launcher.sim) in a temporary directory.

    host = make_sim_host(tmp_path, gpu_count=2, gpu_total_gib=24.0)
    tiny = str(model_dir("tiny-1b-sim"))
    with host.start("--model-path", tiny, "--port", str(free_port())) as sim:
        sim.wait_for("The server is fired up and ready to roll!")

``SimHost.env`` is a complete environment for subprocesses (the host file, PYTHONPATH, no
proxy for loopback, and ``bin_dir`` first on PATH). ``bin_dir`` holds two shims that also
work without that environment (e.g. over SSH), since they carry the host path themselves:
``nvidia-smi`` (launcher.sim.nvidia_smi) and ``sglang-sim-server`` (launcher.sim.server).
"""

from __future__ import annotations

import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MODELS_DIR = REPO / "configs" / "sim" / "models"
READY_LINE = "The server is fired up and ready to roll!"


def model_dir(name: str) -> Path:
    """A shipped simulated model directory (``tiny-1b-sim``, ``llama-70b-sim``)."""
    path = MODELS_DIR / name
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no simulated model {name!r} under {MODELS_DIR}")
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, from below the ephemeral range
    (:func:`free_ports`: no other process is handed it by binding port 0)."""
    return free_ports(1)[0]


# free_ports draws from here up to the kernel's ephemeral range (ip_local_port_range).
_FIXED_PORTS_LOW = 10000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1, each free now, for servers that bind them
    only later (many sim servers starting at once, on a box running other tests).

    :func:`free_port` returns what the kernel gives for port 0, and it gives that port to the
    next process binding port 0 just as well (another test worker's server, listener or
    ``free_port``) until our server has bound it: the launcher then finds the port held by
    its own user and rightly gives the server up. These ports come at random from below the
    ephemeral range instead, where neither port 0 nor an outgoing connection is ever given
    a port; each is bound while the others are chosen, so they are distinct.
    """
    low, high = _FIXED_PORTS_LOW, _ephemeral_low()
    if high - low < 100 * count:  # an unusual ip_local_port_range: fall back to port 0
        low, high = 0, 0
    rng = random.SystemRandom()  # not the seeded module random: workers would pick alike
    held: list[socket.socket] = []
    try:
        while len(held) < count:
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", rng.randrange(low, high) if high else 0))
            except OSError:
                s.close()
                continue
            held.append(s)
        return [int(s.getsockname()[1]) for s in held]
    finally:
        for s in held:
            s.close()


def split_output(text: str) -> list[str]:
    """Lines of sim output split the way SGLang's must be read: on ``\\r`` and ``\\n``."""
    return [line for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n") if line]


class SimProcess:
    """A running sim server; its stdout and stderr are merged and collected by a thread.

    Use as a context manager: on exit the server is SIGKILLed if still alive (its scheduler
    children follow it by PDEATHSIG)."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> None:
        self.argv = list(argv)
        self.proc = subprocess.Popen(
            self.argv,
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self._chunks: list[bytes] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while chunk := os.read(fd, 65536):
            with self._lock:
                self._chunks.append(chunk)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def output(self) -> str:
        """Everything printed so far (``\\r`` kept)."""
        with self._lock:
            return b"".join(self._chunks).decode(errors="replace")

    def lines(self) -> list[str]:
        return split_output(self.output)

    def wait_for(self, text: str, timeout: float = 15.0) -> None:
        """Wait until ``text`` appears in the output; AssertionError (with the output) if the
        process ends or the time runs out first."""
        deadline = time.monotonic() + timeout
        while text not in self.output:
            if self.proc.poll() is not None:
                self._reader.join(timeout=2)
                if text in self.output:
                    return
                raise AssertionError(
                    f"sim exited {self.proc.returncode} before {text!r}:\n{self.output}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} within {timeout}s:\n{self.output}")
            time.sleep(0.01)

    def wait(self, timeout: float = 15.0) -> int:
        """Wait for the exit; returns Popen's returncode (-9 for SIGKILL)."""
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=2)
        return code

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._reader.join(timeout=2)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> SimProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@dataclass(frozen=True)
class SimHost:
    """A simulated GPU host: its JSON file, its state dir, an environment and shims."""

    path: Path
    state_dir: Path
    env: dict[str, str]
    bin_dir: Path

    def server_argv(self, *flags: str) -> list[str]:
        return [sys.executable, "-m", "launcher.sim.server", *flags]

    def run_env(
        self,
        *,
        version: str | None = None,
        faults: Path | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """``env`` plus the SGLang version, a fault profile and anything else."""
        env = dict(self.env)
        if version is not None:
            env["SGLANG_SIM_VERSION"] = version
        if faults is not None:
            env["SGLANG_SIM_FAULTS"] = str(faults)
        env.update(extra or {})
        return env

    def start(
        self,
        *flags: str,
        version: str | None = None,
        faults: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> SimProcess:
        """Start ``python -m launcher.sim.server *flags`` on this host."""
        run_env = self.run_env(version=version, faults=faults, extra=env)
        return SimProcess(self.server_argv(*flags), run_env, REPO)

    def run(
        self,
        *flags: str,
        version: str | None = None,
        faults: Path | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> tuple[int, str]:
        """Run a sim server to its end; (returncode, merged output)."""
        with self.start(*flags, version=version, faults=faults, env=env) as sim:
            code = sim.wait(timeout=timeout)
            return code, sim.output

    def nvidia_smi(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "launcher.sim.nvidia_smi", *args],
            env=self.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
        )

    def write_faults(self, faults: list[dict[str, Any]], name: str = "faults.json") -> Path:
        """Write a fault profile next to the host file; returns its path."""
        path = self.path.parent / name
        path.write_text(json.dumps(faults))
        return path


def make_sim_host(
    tmp_path: Path,
    *,
    gpu_count: int = 8,
    gpu_total_gib: float = 79.19,
    time_scale: float = 0.003,
    gpu_name: str = "NVIDIA H100 80GB HBM3",
    foreign_used_gib: Mapping[int, float] | None = None,
) -> SimHost:
    """Create ``tmp_path/simhost/host.json`` (state in ``state/`` next to it) and the shims."""
    root = tmp_path / "simhost"
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = root / "host.json"
    path.write_text(
        json.dumps(
            {
                "gpu_count": gpu_count,
                "gpu_total_gib": gpu_total_gib,
                "gpu_name": gpu_name,
                "state_dir": "state",
                "time_scale": time_scale,
                "foreign_used_gib": {str(k): v for k, v in (foreign_used_gib or {}).items()},
            }
        )
    )
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    for shim, module in (
        ("nvidia-smi", "launcher.sim.nvidia_smi"),
        ("sglang-sim-server", "launcher.sim.server"),
    ):
        script = bin_dir / shim
        script.write_text(
            "#!/bin/sh\n"
            f'export SGLANG_SIM_HOST="${{SGLANG_SIM_HOST:-{path}}}"\n'
            f"export PYTHONPATH={shlex.quote(pythonpath)}\n"
            f'exec {shlex.quote(sys.executable)} -m {module} "$@"\n'
        )
        script.chmod(0o755)
    env = dict(os.environ)
    for key in (
        "SGLANG_SIM_VERSION",
        "SGLANG_SIM_FAULTS",
        "SGLANG_SIM_TIME_SCALE",
        "LAUNCHER_ATTEMPT",
        "SGL_FORCE_SHUTDOWN",
        "CUDA_VISIBLE_DEVICES",
    ):
        env.pop(key, None)
    env.update(
        SGLANG_SIM_HOST=str(path),
        PYTHONPATH=pythonpath,
        PATH=os.pathsep.join([str(bin_dir), env.get("PATH", "")]),
        no_proxy="127.0.0.1,localhost",
        NO_PROXY="127.0.0.1,localhost",
    )
    return SimHost(path=path, state_dir=root / "state", env=env, bin_dir=bin_dir)

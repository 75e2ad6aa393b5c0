#!/usr/bin/env python3
"""Measure launcher's memory and time against hostile remote data (docs/security.md).

    .venv/bin/python scripts/measure_bounds.py            # all cases, a table on stdout
    .venv/bin/python scripts/measure_bounds.py --json     # the same as JSON

Each case runs the real `launcher` CLI as a subprocess on the local transport against a
simulated host in a temporary directory, and reports its exit status, wall time and peak RSS
(``wait4``'s ru_maxrss). The cases:

- ``status-400MB-log``: `status` of an attempt whose log is 400 MB.
- ``up-800MB-health``: `up --until-ready` of a server whose /health sends an 800 MB body.
- ``status-800MB-health``: `status` (with its health check) of that server.
- ``status-trickle-health``: `status` of a server whose /health body trickles 1 byte / 5 s.
- ``check-500MB-nvidia-smi``: `check` with an nvidia-smi printing 500 MB.
- ``follower-400x1MiB-lines``: a LogFollower fed 400 lines of 1 MiB (in a child python).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.simhost import free_port  # noqa: E402
from tests.supervise import SimSetup, cli_argv, cli_env  # noqa: E402

MB = 1_000_000


def measured(argv: list[str], env: dict[str, str] | None = None,
             timeout: float = 600.0) -> dict[str, Any]:
    """Run ``argv``; its exit status, wall seconds and peak RSS in MB."""
    started = time.monotonic()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.PIPE)
        assert proc.stderr is not None
        deadline = started + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
        stderr = proc.stderr.read().decode(errors="replace")
        out.seek(0)
        stdout = out.read(100_000).decode(errors="replace")
        return {"rc": os.waitstatus_to_exitcode(status),
                "wall_s": round(time.monotonic() - started, 2),
                "max_rss_mb": round(usage.ru_maxrss / 1024, 1), "stderr_tail": stderr[-300:],
                "stdout_head": stdout[:1500]}


def cli(*args: str) -> dict[str, Any]:
    return measured(cli_argv(*args), env=cli_env())


def setup(root: Path, name: str, server: dict[str, Any] | None = None,
          host: dict[str, Any] | None = None) -> tuple[SimSetup, Path]:
    d = root / name
    d.mkdir()
    sim = SimSetup.create(d)
    data = sim.data(mem_fraction_static=0.8, cuda_graph_max_bs=8, server=server)
    data["hosts"][0].update(host or {})
    return sim, sim.write_toml(data)


def hostile(mode: str, body: int, port: int) -> dict[str, Any]:
    return {"command": [sys.executable, "-m", "tests.hostile_http", mode, str(body), str(port)]}


def case_status_log(root: Path) -> dict[str, Any]:
    sim, config = setup(root, "log")
    d = sim.attempt_dir(1)
    d.mkdir(parents=True)
    (d / "exit_status").write_text("1\n")
    line = b"[2026-01-01 00:00:10] Decode batch. #running-req: 1, #token: 100, gen throughput: 1\n"
    block = line * (MB // len(line))
    with (d / "log").open("wb") as f:
        for _ in range(400):
            f.write(block)
    return cli("status", str(config), "--json")


def case_health(root: Path, mode: str, body: int, command: str) -> dict[str, Any]:
    """`up --until-ready` of the hostile server; or `status` of it, launched as an attempt
    directly (a trickling /health never lets `up` call it ready)."""
    port = free_port()
    sim, config = setup(root, f"{mode}-{command}", server={**hostile(mode, body, port),
                                                          "port": port})
    try:
        if command == "up":
            return cli("up", str(config), "--until-ready", "--log-format", "json")
        launch = ("import anyio, sys\n"
                  "from launcher.host import run as remote\n"
                  "from launcher.host.transport.local import LocalTransport\n"
                  "spec = remote.AttemptSpec(server='sim0', attempt=1, run_dir=sys.argv[1],\n"
                  "    argv=sys.argv[2:], env={'PYTHONPATH': sys.argv[1]})\n"
                  "anyio.run(remote.launch, LocalTransport('h'), spec)\n")
        subprocess.run([sys.executable, "-c", launch, str(sim.run_dir),
                        *hostile(mode, body, port)["command"]], cwd=REPO, check=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
        time.sleep(1.0)  # its ready line
        return cli("status", str(config), "--json")
    finally:
        sim.cleanup()


def case_check(root: Path) -> dict[str, Any]:
    _, config = setup(root, "smi", host={
        "nvidia_smi": ["sh", "-c", "head -c 500000000 /dev/zero | tr '\\0' x"]})
    return cli("check", str(config))


def case_follower(root: Path) -> dict[str, Any]:
    code = ("from launcher.sglang.logparse import LogFollower\n"
            "f = LogFollower()\n"
            "for i in range(400):\n"
            "    f.feed_line(chr(97 + i % 26) * (1 << 20))\n"
            "print(sum(map(len, f.last_lines)))\n")
    return measured([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)})


CASES: dict[str, Callable[[Path], dict[str, Any]]] = {
    "status-400MB-log": case_status_log,
    "up-800MB-health": lambda r: case_health(r, "huge", 800 * MB, "up"),
    "status-800MB-health": lambda r: case_health(r, "huge", 800 * MB, "status"),
    "status-trickle-health": lambda r: case_health(r, "trickle", 1000, "status"),
    "check-500MB-nvidia-smi": case_check,
    "follower-400x1MiB-lines": case_follower,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("cases", nargs="*", help=f"some of: {', '.join(CASES)} (default all)")
    args = parser.parse_args()
    unknown = set(args.cases) - set(CASES)
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)}; choose from {', '.join(CASES)}")
    results = {}
    with tempfile.TemporaryDirectory(prefix="launcher-bounds-") as tmp:
        for name in args.cases or list(CASES):
            results[name] = CASES[name](Path(tmp))
            if not args.json:
                r = results[name]
                print(f"{name:26} rc={r['rc']:<3} {r['wall_s']:7.2f} s  "
                      f"{r['max_rss_mb']:7.1f} MB", flush=True)
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

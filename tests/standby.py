"""Two (or more) real `launcher up` processes sharing a lease in a real PostgreSQL: the
helpers of tests/test_standby.py and scripts/bench/bench_takeover.py."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.simhost import REPO
from tests.supervise import SimSetup, cli_argv, cli_env, json_lines

TTL = "4s"


def coordinated_config(sim: SimSetup, box: str, lease: str, *, ttl: str = TTL,
                       metrics_port: int | None = None, **data_kwargs: Any) -> Path:
    """A config file for ``box``: the sim's one server, the shared run dir, a state dir of
    its own and a ``[coordination]`` table whose DSN is read from ``$PG_DSN``; with
    ``metrics_port``, ``[metrics]`` on 127.0.0.1 at that port."""
    data = sim.data(**data_kwargs)
    data["state_dir"] = str(sim.root / f"state-{box}")
    data["coordination"] = {"dsn": "env:PG_DSN", "ttl": ttl, "box": box, "lease": lease}
    if metrics_port is not None:
        data["metrics"] = {"listen": f"127.0.0.1:{metrics_port}"}
    return sim.write_toml(data, f"{box}.toml")


class Up:
    """One `launcher up --log-format json` of ``box``, its output in ``<root>/<box>.log``."""

    def __init__(self, sim: SimSetup, box: str, dsn: str, lease: str, *, ttl: str = TTL,
                 metrics_port: int | None = None, **data_kwargs: Any) -> None:
        self.box = box
        self.metrics_port = metrics_port
        config = coordinated_config(sim, box, lease, ttl=ttl, metrics_port=metrics_port,
                                    **data_kwargs)
        self.log_path = sim.root / f"{box}.log"
        self._out: IO[bytes] = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            cli_argv("up", str(config), "--log-format", "json"), cwd=REPO,
            env=cli_env({"PG_DSN": dsn}), stdout=self._out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL)

    def lines(self) -> list[dict[str, Any]]:
        return json_lines(self.log_path.read_text(errors="replace"))

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.lines() if e.get("event") == name]

    def wait(self, name: str, count: int = 1, timeout: float = 90.0) -> dict[str, Any]:
        """The ``count``-th ``name`` event; fails after ``timeout`` s or when the launcher
        exited without it."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.events(name)
            if len(found) >= count:
                return found[count - 1]
            if self.proc.poll() is not None and len(self.events(name)) < count:
                raise AssertionError(f"{self.box} exited {self.proc.returncode} before "
                                     f"{name!r}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.box}: no {name!r} in {timeout}s:\n{self.tail()}")
            time.sleep(0.05)

    def wait_for(self, match: Callable[[dict[str, Any]], bool],
                 timeout: float = 90.0) -> dict[str, Any]:
        """The first line ``match`` accepts (fails as ``wait`` does)."""
        deadline = time.monotonic() + timeout
        while True:
            found = [e for e in self.lines() if match(e)]
            if found:
                return found[0]
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{self.box}: no matching line (exit "
                                     f"{self.proc.poll()}):\n{self.tail()}")
            time.sleep(0.05)

    def leader(self, lease: str) -> float | None:
        """``launcher_leader{lease}`` scraped from this launcher's /metrics over HTTP (it
        needs ``metrics_port``); None when the endpoint does not answer or lacks it."""
        assert self.metrics_port is not None
        try:
            text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics",
                             timeout=5.0).text
        except httpx.HTTPError:
            return None
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "launcher_leader" and sample.labels == {"lease": lease}:
                    return sample.value
        return None

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def signal(self, sig: signal.Signals) -> None:
        """Signal this launcher (a process this test started, by its Popen handle)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def exit_code(self, timeout: float = 60.0) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> None:
        """SIGCONT then SIGTERM; SIGKILL after 20 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._out.close()


def stamp(event: dict[str, Any]) -> float:
    """An event line's timestamp (structlog's ISO-8601, UTC) in seconds since the epoch."""
    return datetime.fromisoformat(str(event["timestamp"]).replace("Z", "+00:00")).timestamp()

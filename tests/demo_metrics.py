"""The demo's live ``/metrics``: ``configs/demo.toml`` run by the real CLI on a private sim host.

The demo's config is taken as it is (its policy, model, memory settings: the first attempt
runs out of memory capturing CUDA graphs, the second comes up ready), with only what must be
private to a test replaced: the state and run directories, the sim host, the server's port,
and a ``[metrics]`` listen address on a free port.

Also what the exposition says in a form the rule and dashboard tests compare against: the
series names (samples' and families') and each metric's label names.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from launcher.hooks.identity import ServerFacts
from launcher.hooks.metrics import Metrics
from launcher.params import LaunchParams
from launcher.sglang.outcome import Confidence, Outcome
from launcher.sglang.phases import Phase
from launcher.supervise import events as ev
from tests import procs
from tests.simhost import REPO, free_port
from tests.supervise import SimSetup, cli_argv, cli_env, run_cli

DEMO = REPO / "configs" / "demo.toml"
# Prometheus adds these to every scraped series (and `up` is its own series per target).
SCRAPE_LABELS = frozenset({"job", "instance"})
SCRAPE_SERIES = frozenset({"up"})


@dataclass(frozen=True)
class Exposition:
    """What one ``/metrics`` answer holds: the text and, per series name, its label names.

    ``labels`` has an entry for every sample name (``launcher_attempts_total``,
    ``launcher_startup_duration_seconds_bucket``); a family that has no sample yet (the demo
    has no router, its host never became unreachable) still has its family name and, from
    its TYPE, the names its samples would have, with no label names known.
    """

    text: str
    labels: dict[str, frozenset[str]]


def read_exposition(text: str) -> Exposition:
    """``text`` (the text exposition format) as an :class:`Exposition`."""
    labels: dict[str, set[str]] = {}
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                "summary": ("_sum", "_count"), "info": ("_info",)}
    for family in text_string_to_metric_families(text):
        for suffix in ("", *suffixes.get(family.type, ())):
            labels.setdefault(family.name + suffix, set())
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    return Exposition(text, {name: frozenset(found) for name, found in labels.items()})


def demo_data(sim: SimSetup, metrics_port: int) -> dict[str, Any]:
    """configs/demo.toml with the test's private paths, sim host, port and a metrics address."""
    data = tomllib.loads(DEMO.read_text())
    configs = str(DEMO.parent)
    data["state_dir"] = str(sim.state_dir)
    [host] = data["hosts"]
    host["env"] = sim.host_env  # the private sim host instead of configs/sim/host.json
    host["run_dir"] = str(sim.run_dir)
    [server] = data["servers"]
    server["model_path"] = server["model_path"].replace("{config_dir}", configs)
    server["port"] = sim.port
    data["metrics"] = {"listen": f"127.0.0.1:{metrics_port}"}
    return data


def _sample(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


@dataclass
class DemoRun:
    """A running ``launcher up`` of the demo (see :func:`run_demo`)."""

    url: str
    sim: SimSetup
    config: Path

    def scrape(self) -> str:
        response = httpx.get(self.url, timeout=5)
        response.raise_for_status()
        return response.text

    def wait_ready(self, timeout: float = 90.0) -> str:
        """The exposition once the demo's server is ready (after its OOM and relaunch)."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                last = self.scrape()
            except httpx.HTTPError:  # not listening yet
                time.sleep(0.2)
                continue
            if _sample(last, "launcher_server_ready", server="demo") == 1:
                return last
            time.sleep(0.2)
        raise AssertionError(f"the demo was not ready within {timeout:g}s; last scrape:\n{last}")


@contextlib.contextmanager
def run_demo(sim: SimSetup, metrics_port: int | None = None) -> Iterator[DemoRun]:
    """``launcher up`` of the demo as a real subprocess, serving metrics (on ``metrics_port``,
    else a free port), until the block ends; then the launcher is stopped (SIGTERM to the
    process this started), ``launcher down`` stops the server, and any server process the
    launch recorded is killed."""
    metrics_port = metrics_port or free_port()
    config = sim.write_toml(demo_data(sim, metrics_port), "demo.toml")
    proc = subprocess.Popen(
        cli_argv("up", str(config), "--fresh"), cwd=REPO, env=cli_env(),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        yield DemoRun(f"http://127.0.0.1:{metrics_port}/metrics", sim, config)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        run_cli("down", str(config), timeout=60)
        base = sim.run_dir / "demo"
        for attempt in base.iterdir() if base.is_dir() else ():
            pid = procs.recorded_pid(attempt)
            if pid is not None:
                procs.signal_group(pid, signal.SIGKILL)


def every_family_fed() -> Exposition:
    """The exposition of a Metrics fed one event of every kind that creates a series the
    demo's run does not (a restart, a host outage, a stall, a follow failure, a router and
    its worker) besides the demo's own (an OOM, ready): every family with samples, so every
    label name each series carries."""
    metrics = Metrics(facts={"demo": ServerFacts(host="sim", model="m")})
    params = LaunchParams(0.95, 256)
    metrics("demo", ev.AttemptStarted(attempt=1, params=params))
    metrics("demo", ev.AttemptFailed(attempt=1, outcome=Outcome.OOM_GRAPH_CAPTURE,
                                     confidence=Confidence.DECISIVE, phase=Phase.CUDA_GRAPH,
                                     numbers={}, retryable=True, after_ready=False, evidence=(),
                                     advice=""))
    metrics("demo", ev.ServerReady(attempt=2, attempts=2, seconds=2.0, attempt_seconds=1.0,
                                   adopted=False, params=params, history=()))
    metrics("demo", ev.RestartScheduled(delay_s=1.0, params=params, attempt=1, restarts_left=4,
                                        restart_budget=5, restart_window_s=3600.0))
    metrics("demo", ev.HostLost(error="down", unreachable_s=0.0))
    metrics("demo", ev.HostReachable(unreachable_s=3.0))
    metrics("demo", ev.StallDetected(phase=Phase.WEIGHTS, silent_s=21.0, attempt=1))
    metrics("demo", ev.FollowFailed(error="lost", retry_in_s=1.0))
    metrics("demo", ev.Probed(ok=False, latency_s=0.1, detail="503"))
    metrics("front", ev.RouterReady(attempt=1, host="sim", port=1, seconds=1.0,
                                    servers=("demo",)))
    metrics("front", ev.RouterWorkerRegistered(server="demo", url="http://x:1"))
    return read_exposition(generate_latest(metrics.registry).decode())


def names_and_labels(expositions: Iterable[Exposition]) -> dict[str, frozenset[str]]:
    """Series name -> every label name it was seen with in any of ``expositions``."""
    merged: dict[str, set[str]] = {}
    for exposition in expositions:
        for name, labels in exposition.labels.items():
            merged.setdefault(name, set()).update(labels)
    return {name: frozenset(labels) for name, labels in merged.items()}

#!/usr/bin/env python3
"""Renders configs/grafana/launcher.json's panels from the demo's real metrics into a PNG
(docs/dashboard.png; docs/operations.md shows it). No Grafana runs here (Debian does not
package it, PyPI and npm have no server), so this draws the panels itself:

    .venv/bin/pip install matplotlib         # not a launcher dependency
    .venv/bin/python scripts/render_dashboard.py [--out docs/dashboard.png]

1. ``launcher up`` runs configs/demo.toml (tests/demo_metrics.py: the demo's config on a
   private sim host at the demo's own time scale, metrics on a free port), as a subprocess.
2. A real Prometheus (Debian's ``prometheus``) scrapes it every second and evaluates
   configs/prometheus/launcher-alerts.yml.
3. What happens to the demo: attempt 1 runs out of memory capturing CUDA graphs and attempt 2
   (mem_fraction_static 0.95) is ready, as in ``scripts/demo``; then the server is SIGKILLed
   (a restart after ready), and the relaunched attempt is SIGSTOPped while it loads (a stall
   the demo's 20 s budget catches), after which the next attempt comes up ready.
4. Every panel's queries go to Prometheus's ``/api/v1/query_range`` as Grafana would send them
   (``$server`` = all, ``$__rate_interval`` = 15s, ``$__range`` = the whole run), and
   matplotlib draws each panel where its ``gridPos`` puts it, titled as in the dashboard.

Resource handling: everything lives in a temporary directory; Prometheus and the launcher
are stopped and every server the demo started is killed at the end, whatever happened.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a plain script: make launcher and tests importable
    sys.path.insert(0, str(REPO))

from tests import procs  # noqa: E402
from tests.demo_metrics import DemoRun, run_demo  # noqa: E402
from tests.simhost import free_port  # noqa: E402
from tests.supervise import SimSetup  # noqa: E402

DASHBOARD = REPO / "configs" / "grafana" / "launcher.json"
RULES = REPO / "configs" / "prometheus" / "launcher-alerts.yml"
DEMO_TIME_SCALE = 0.04  # configs/sim/host.json's


def say(message: str) -> None:
    print(f"render: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def prometheus(workdir: Path, target: str) -> Iterator[str]:
    """A Prometheus scraping ``target`` (job ``launcher``) every second; yields its URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise SystemExit("prometheus is not installed: apt-get install prometheus")
    port = free_port()
    config = workdir / "prometheus.yml"
    config.write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{"job_name": "launcher",
                            "static_configs": [{"targets": [target]}]}],
    }))
    proc = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=(workdir / "prometheus.log").open("wb"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"prometheus did not start: {workdir / 'prometheus.log'}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def sample(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_for(demo: DemoRun, name: str, value: float, timeout: float = 300.0) -> None:
    """Until the demo's /metrics has ``name`` (its first series) at ``value``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if sample(demo.scrape(), name) == value:
                return
        time.sleep(0.5)
    raise SystemExit(f"{name} did not reach {value} within {timeout:g}s")


def attempt_dir(sim: SimSetup, attempt: int) -> Path:
    return sim.run_dir / "demo" / str(attempt)


def play(demo: DemoRun, sim: SimSetup) -> None:
    """The story of step 3 in the module docstring."""
    say("waiting for the demo: OOM in graph capture, then ready")
    demo.wait_ready(timeout=300)
    time.sleep(20)
    say("SIGKILL of the ready server (attempt 2)")
    procs.signal_group(procs.started_pid(attempt_dir(sim, 2)), signal.SIGKILL)
    wait_for(demo, "launcher_server_attempt", 3)
    time.sleep(3)  # into the weights
    say("SIGSTOP of attempt 3 while it loads")
    stopped = procs.started_pid(attempt_dir(sim, 3))
    procs.signal_group(stopped, signal.SIGSTOP)
    wait_for(demo, "launcher_server_attempt", 4, timeout=120)
    procs.signal_group(stopped, signal.SIGCONT)  # launcher killed it; let it go
    wait_for(demo, "launcher_server_ready", 1)
    time.sleep(25)


def grafana_query(expr: str, rng_s: int) -> str:
    return (expr.replace("$__rate_interval", "15s").replace("$__range", f"{rng_s}s")
            .replace("$server", ".*"))


def legend(fmt: str, labels: dict[str, str]) -> str:
    out = fmt
    for key, value in labels.items():
        out = out.replace("{{" + key + "}}", value)
    return out


def query_panels(url: str, start: float, end: float) -> list[dict[str, Any]]:
    """Each panel with its targets' series from query_range."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    rng = int(end - start)
    for panel in panels:
        series = []
        for target in panel["targets"]:
            resp = httpx.get(f"{url}/api/v1/query_range", timeout=30, params={
                "query": grafana_query(target["expr"], rng), "start": start, "end": end,
                "step": 1})
            resp.raise_for_status()
            for result in resp.json()["data"]["result"]:
                points = [(float(t) - start, float(v)) for t, v in result["values"]]
                series.append((legend(target["legendFormat"], result["metric"]), points))
        panel["series"] = series
    return panels


def draw(panels: list[dict[str, Any]], out: Path, seconds: float) -> None:
    import matplotlib  # only this script needs it: imported here, after the run

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.style.use("dark_background")
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    fig = plt.figure(figsize=(14, rows * 0.36), dpi=72, facecolor="#111217")
    fig.suptitle(f"launcher (configs/grafana/launcher.json): the demo, {seconds:.0f} s, "
                 "rendered from Prometheus", color="#ccccdc", fontsize=12, x=0.01, ha="left")
    grid = fig.add_gridspec(rows, 24, hspace=1.6, wspace=0.6, left=0.04, right=0.99,
                            top=0.95, bottom=0.03)
    for panel in panels:
        pos = panel["gridPos"]
        ax = fig.add_subplot(grid[pos["y"]:pos["y"] + pos["h"] - 1, pos["x"]:pos["x"] + pos["w"]])
        ax.set_facecolor("#181b1f")
        ax.set_title(panel["title"], loc="left", fontsize=10, color="#ccccdc")
        ax.tick_params(labelsize=7, colors="#9fa7b3")
        for spine in ax.spines.values():
            spine.set_color("#2c3235")
        if panel["type"] == "stat":
            ax.set_axis_off()
            for i, (name, points) in enumerate(panel["series"]):
                value = points[-1][1] if points else float("nan")
                ax.text(0.02 + i * 0.33, 0.3, f"{value:g}", fontsize=20, color="#73bf69",
                        transform=ax.transAxes)
                ax.text(0.02 + i * 0.33, 0.05, name, fontsize=8, color="#ccccdc",
                        transform=ax.transAxes)
            continue
        if not panel["series"]:
            ax.text(0.5, 0.5, "No data", ha="center", va="center", color="#9fa7b3",
                    transform=ax.transAxes)
        custom = panel["fieldConfig"]["defaults"].get("custom", {})
        if custom.get("stacking", {}).get("mode") == "normal" and panel["series"]:
            # Stacked as Grafana stacks it: every series on one time grid, missing points 0.
            grid_t = sorted({t for _, points in panel["series"] for t, _ in points})
            stacks = [[dict(points).get(t, 0.0) for t in grid_t] for _, points in panel["series"]]
            ax.stackplot(grid_t, stacks, labels=[name for name, _ in panel["series"]],
                         step="post", alpha=0.8)
        else:
            for name, points in panel["series"]:
                xs, ys = zip(*points, strict=True)
                ax.step(xs, ys, where="post", label=name, linewidth=1.4)
        if custom.get("scaleDistribution", {}).get("type") == "log":
            ax.set_yscale("log")
        ax.set_xlim(0, seconds)
        ax.set_xlabel("seconds since launcher up", fontsize=7, color="#9fa7b3")
        if panel["series"]:
            ax.legend(fontsize=7, loc="upper left", frameon=False, ncol=2)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, facecolor=fig.get_facecolor())
    say(f"wrote {out} ({out.stat().st_size} bytes)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "dashboard.png")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="render-dashboard-") as tmp:
        workdir = Path(tmp)
        sim = SimSetup.create(workdir / "sim", time_scale=DEMO_TIME_SCALE)
        port = free_port()
        try:
            with prometheus(workdir, f"127.0.0.1:{port}") as url:
                start = time.time()
                with run_demo(sim, metrics_port=port) as demo:
                    play(demo, sim)
                    end = time.time()
                    time.sleep(2)  # the last scrape
                panels = query_panels(url, start, end)
        finally:
            sim.cleanup()
            for attempt in (sim.run_dir / "demo").glob("*"):
                pid = procs.recorded_pid(attempt)
                if pid is not None:
                    procs.signal_group(pid, signal.SIGKILL)
    draw(panels, args.out, end - start)


if __name__ == "__main__":
    main()

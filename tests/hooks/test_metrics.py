"""Prometheus metrics: fed with supervisor events and snapshots, scraped over real HTTP."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from launcher import __version__
from launcher.errors import ConfigError
from launcher.hooks.identity import ServerFacts
from launcher.hooks.metrics import Metrics, MetricsServer
from launcher.params import LaunchParams
from launcher.sglang.outcome import Confidence, Outcome
from launcher.sglang.phases import Phase
from launcher.supervise import events as ev
from launcher.supervise.lifecycle import State

Labels = frozenset[tuple[str, str]]


@dataclass
class Snap:
    """The attributes update_states reads (launcher.supervise.supervisor.Snapshot has them)."""

    server: str
    state: str
    attempt: int = 1


@pytest.fixture
def metrics() -> Metrics:
    """A Metrics with its own registry, told what llama and qwen are."""
    return Metrics(facts=FACTS)


FACTS = {
    "llama": ServerFacts(host="gpu1", model="Llama-3.1-70B-Instruct", endpoint="10.0.0.5:30000",
                         gpus="0,1", sglang_version="0.5.10"),
    "qwen": ServerFacts(host="gpu2", model="Qwen3-8B", endpoint="10.0.0.6:30001", gpus="3",
                        sglang_version="0.5.23"),
}


@pytest.fixture
def served(metrics: Metrics) -> Iterator[MetricsServer]:
    """The metrics' endpoint on a free loopback port."""
    server = metrics.serve("127.0.0.1", 0)
    yield server
    server.close()


async def exposition(server: MetricsServer) -> str:
    """GET /metrics: the text exposition format."""
    async with httpx.AsyncClient() as client:
        response = await client.get(server.url, timeout=5)
    assert 200 == response.status_code
    assert response.headers["content-type"].startswith("text/plain")
    return response.text


async def scrape(server: MetricsServer) -> dict[tuple[str, Labels], float]:
    """GET /metrics and return every sample as (name, labels) -> value."""
    text = await exposition(server)
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def L(**labels: str) -> Labels:
    return frozenset(labels.items())


def S(server: str, **labels: str) -> Labels:
    """The labels of ``server``'s series: its name, its host (from FACTS) and ``labels``."""
    return L(server=server, host=FACTS[server].host, **labels)


LLAMA = {"server": "llama", "host": "gpu1"}
NO_PARAMS = LaunchParams()


def ready_event(seconds: float | None, attempts: int = 1) -> ev.ServerReady:
    return ev.ServerReady(attempt=attempts, attempts=attempts, seconds=seconds,
                          attempt_seconds=seconds, adopted=False, params=NO_PARAMS, history=())


def failed(attempt: int, outcome: Outcome, phase: Phase) -> ev.AttemptFailed:
    return ev.AttemptFailed(attempt=attempt, outcome=outcome, confidence=Confidence.DECISIVE,
                            phase=phase, numbers={}, retryable=True, after_ready=False,
                            evidence=(), advice="")


def feed_llama_story(metrics: Metrics) -> None:
    """An OOM in graph capture, then a second attempt that comes up ready (as the supervisor
    reports it), while another server is still capturing graphs."""
    metrics("llama", ev.AttemptStarted(attempt=1, params=LaunchParams(0.9)))
    metrics("llama", failed(1, Outcome.OOM_GRAPH_CAPTURE, Phase.CUDA_GRAPH))
    metrics("llama", ev.PolicyDecided(params=NO_PARAMS, reason="lower the fraction"))
    metrics("llama", ev.AttemptStarted(attempt=2, params=LaunchParams(0.85)))
    metrics("llama", ev.Probed(ok=False, latency_s=0.5, detail="503"))
    metrics("llama", ev.Probed(ok=True, latency_s=0.012, detail="200"))
    metrics("llama", ready_event(95.5, attempts=2))
    metrics("qwen", ev.AttemptStarted(attempt=1, params=NO_PARAMS))
    metrics.update_states([Snap("llama", "ready", 2), Snap("qwen", "cuda_graph", 1)])


async def test_scrape_shows_what_the_events_said(metrics: Metrics, served: MetricsServer) -> None:
    """After an OOM and a ready second attempt, the endpoint reports attempts, failures by
    outcome, readiness, time to ready, probe latency and each server's state."""
    feed_llama_story(metrics)
    got = await scrape(served)
    assert 2 == got["launcher_attempts_total", S("llama")]
    assert 1 == got["launcher_attempts_total", S("qwen")]
    assert (
        1 == got["launcher_attempt_failures_total", S("llama", outcome="oom_graph_capture")]
    )
    assert 1 == got["launcher_server_ready", S("llama")]
    assert 0 == got["launcher_server_ready", S("qwen")]
    assert 2 == got["launcher_server_attempt", S("llama")]
    assert 95.5 == got["launcher_time_to_ready_seconds", S("llama")]
    assert 1 == got["launcher_startup_duration_seconds_count", S("llama")]
    assert 95.5 == got["launcher_startup_duration_seconds_sum", S("llama")]
    assert 0 == got["launcher_startup_duration_seconds_bucket", S("llama", le="60.0")]
    assert 1 == got["launcher_startup_duration_seconds_bucket", S("llama", le="120.0")]
    assert 2 == got["launcher_probe_latency_seconds_count", S("llama")]
    assert 0.512 == got["launcher_probe_latency_seconds_sum", S("llama")]
    assert 1 == got["launcher_probe_latency_seconds_bucket",
                    S("llama", le="0.025")]
    assert 2 == got["launcher_probe_latency_seconds_bucket",
                    S("llama", le="0.5")]
    assert 1 == got["launcher_probes_total", S("llama", result="ok")]
    assert 1 == got["launcher_probes_total", S("llama", result="failed")]
    assert 1 == got["launcher_server_state", S("llama", state="ready")]
    assert 0 == got["launcher_server_state", S("llama", state="cuda_graph")]
    assert 1 == got["launcher_server_state", S("qwen", state="cuda_graph")]


async def test_exactly_one_state_is_current(metrics: Metrics, served: MetricsServer) -> None:
    """Every State has a series per server, and only the latest state's is 1."""
    metrics.update_states([Snap("llama", "weights")])
    metrics.update_states([Snap("llama", "cuda_graph")])
    metrics("llama", ev.ServerGaveUp(reason="oom_weights", attempt=1, attempts=1, history=()))
    got = await scrape(served)
    states = {
        dict(labels)["state"]: value
        for (name, labels), value in got.items()
        if name == "launcher_server_state"
    }
    assert {state.value for state in State} == set(states)
    assert {"gave_up": 1.0} == {state: value for state, value in states.items() if value}


async def test_ready_drops_on_failure_and_unhealthy(
    metrics: Metrics, served: MetricsServer
) -> None:
    """launcher_server_ready goes back to 0 when a ready server turns unhealthy or fails,
    and a restart after ready is counted."""
    metrics("llama", ready_event(30.0))
    ready = (await scrape(served))["launcher_server_ready", S("llama")]
    metrics("llama", ev.ServerUnhealthy(consecutive_failures=3, detail="timeout"))
    unhealthy = (await scrape(served))["launcher_server_ready", S("llama")]
    metrics("llama", ev.RestartScheduled(delay_s=10.0, params=NO_PARAMS, attempt=1,
                                         restarts_left=2, restart_budget=3,
                                         restart_window_s=3600))
    got = await scrape(served)
    assert (1, 0) == (ready, unhealthy)
    assert 1 == got["launcher_restarts_total", S("llama")]


async def test_process_series_are_exposed(served: MetricsServer) -> None:
    """The private registry still carries the standard process and python series."""
    names = {name for name, _ in await scrape(served)}
    assert "python_info" in names
    assert "process_cpu_seconds_total" in names


def test_hook_skips_figures_that_are_not_finite(metrics: Metrics) -> None:
    """A time to ready or a probe latency that is not a finite number is left out (the
    events' types rule out the rest), and nothing is logged."""
    with capture_logs() as logs:
        metrics("llama", ready_event(float("nan")))
        metrics("llama", ev.Probed(ok=True, latency_s=float("nan"), detail="200"))
        metrics("llama", failed(1, Outcome.OOM_KV_CACHE, Phase.KV_CACHE))
    assert [] == [entry["event"] for entry in logs]
    value = metrics.registry.get_sample_value
    assert value("launcher_time_to_ready_seconds", LLAMA) is None
    assert value("launcher_probe_latency_seconds_count", LLAMA) is None
    assert 1 == value("launcher_attempt_failures_total", {**LLAMA, "outcome": "oom_kv_cache"})


async def test_port_zero_reports_the_bound_port_and_close_stops_serving(
    metrics: Metrics,
) -> None:
    """serve(host, 0) binds a free port and says which; after close() nothing answers there."""
    server = metrics.serve("127.0.0.1", 0)
    try:
        assert 0 < server.port
        assert f"http://127.0.0.1:{server.port}/metrics" == server.url
        assert await scrape(server)
    finally:
        server.close()
    server.close()  # idempotent
    async with httpx.AsyncClient() as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(server.url, timeout=2)


def test_busy_port_is_a_config_error(metrics: Metrics) -> None:
    """A port another process listens on raises ConfigError naming metrics.listen."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError) as caught:
            metrics.serve("127.0.0.1", port)
    assert 1 == len(caught.value.problems)
    assert caught.value.problems[0].startswith(f"metrics.listen: cannot listen on 127.0.0.1:{port}")


async def test_host_outages_are_a_gauge_and_their_seconds_a_counter(
    metrics: Metrics, served: MetricsServer
) -> None:
    """host.unreachable sets the gauge; host.reachable clears it and adds the outage's length."""
    metrics("llama", ev.HostLost(error="down", unreachable_s=0.0))
    during = await scrape(served)
    metrics("llama", ev.HostReachable(unreachable_s=12.5))
    metrics("llama", ev.HostLost(error="down", unreachable_s=0.0))
    metrics("llama", ev.HostReachable(unreachable_s=2.0))
    after = await scrape(served)
    assert 1 == during["launcher_host_unreachable", S("llama")]
    assert 0 == after["launcher_host_unreachable", S("llama")]
    assert 14.5 == after["launcher_host_unreachable_seconds_total", S("llama")]


async def test_a_nodes_outage_is_labelled_with_that_nodes_host(
    metrics: Metrics, served: MetricsServer
) -> None:
    """A multi-node server whose node 1 (gpu3) is out of reach: the gauge and the seconds are
    gpu3's, so LauncherHostUnreachable (max by host) pages gpu3, not node 0's healthy gpu1."""
    metrics("llama", ev.HostLost(error="down", node="gpu3", unreachable_s=0.0))
    during = await scrape(served)
    metrics("llama", ev.HostReachable(node="gpu3", unreachable_s=7.0))
    after = await scrape(served)
    gpu3 = frozenset({("server", "llama"), ("host", "gpu3")})
    assert (1, 0) == (during["launcher_host_unreachable", gpu3],
                      after["launcher_host_unreachable", gpu3])
    assert 0 == during["launcher_host_unreachable_seconds_total", gpu3]  # born at 0
    assert 7.0 == after["launcher_host_unreachable_seconds_total", gpu3]
    assert ("launcher_host_unreachable", S("llama")) not in during  # gpu1 never paged


async def test_build_and_server_info_and_a_host_label_everywhere(
    metrics: Metrics, served: MetricsServer
) -> None:
    """launcher_build_info names the version; launcher_server_info what each server runs;
    every per-server series carries the server's host."""
    feed_llama_story(metrics)
    got = await scrape(served)
    build = [dict(labels) for name, labels in got if name == "launcher_build_info"]
    assert 1 == len(build) and __version__ == build[0]["version"]
    assert 1 == got["launcher_server_info", L(
        server="llama", host="gpu1", model="Llama-3.1-70B-Instruct", sglang_version="0.5.10",
        endpoint="10.0.0.5:30000", gpus="0,1")]
    assert 1 == got["launcher_server_info", L(
        server="qwen", host="gpu2", model="Qwen3-8B", sglang_version="0.5.23",
        endpoint="10.0.0.6:30001", gpus="3")]
    launcher_wide = {"launcher_build_info", "launcher_leader"}  # about launcher itself
    per_server = [dict(labels) for name, labels in got
                  if name.startswith("launcher_") and name not in launcher_wide]
    assert per_server
    assert all(FACTS[labels["server"]].host == labels["host"] for labels in per_server)


async def test_no_created_series(metrics: Metrics, served: MetricsServer) -> None:
    """Counters and histograms expose no *_created samples."""
    feed_llama_story(metrics)
    text = await exposition(served)
    families = list(text_string_to_metric_families(text))
    assert any(f.type == "counter" for f in families)
    assert [] == [s.name for f in families for s in f.samples if s.name.endswith("_created")]
    assert "_created" not in text


async def test_describe_moves_a_server_to_its_new_host(metrics: Metrics,
                                                       served: MetricsServer) -> None:
    """describe() again with another host: the info series follows, the old one is gone."""
    metrics.describe("llama", ServerFacts(host="gpu9", model="m", endpoint="gpu9:1"))
    got = await scrape(served)
    hosts = {dict(labels)["host"] for name, labels in got
             if name == "launcher_server_info" and dict(labels)["server"] == "llama"}
    assert {"gpu9"} == hosts


async def test_oom_back_off_steps_stalls_follow_failures_and_leader(
    metrics: Metrics, served: MetricsServer
) -> None:
    """Each attempt's memory settings are gauges (a setting left to SGLang has no series); a
    stall's silence is observed by phase; follow failures are counted; a launcher is leader."""
    metrics("llama", ev.AttemptStarted(attempt=1, params=LaunchParams(0.99, 256)))
    first = await scrape(served)
    metrics("llama", ev.AttemptStarted(attempt=2, params=LaunchParams(0.95, 256)))
    second = await scrape(served)
    metrics("llama", ev.AttemptStarted(attempt=3, params=LaunchParams(None, 128)))
    metrics("llama", ev.StallDetected(phase=Phase.WEIGHTS, silent_s=21.5, attempt=3))
    metrics("llama", ev.FollowFailed(error="channel lost", retry_in_s=1.0))
    metrics("llama", ev.FollowFailed(error="channel lost", retry_in_s=2.0))
    third = await scrape(served)
    mfs, bs = "launcher_attempt_mem_fraction_static", "launcher_attempt_cuda_graph_max_bs"
    assert (0.99, 0.95) == (first[mfs, S("llama")], second[mfs, S("llama")])
    assert (mfs, S("llama")) not in third
    assert (256, 128) == (second[bs, S("llama")], third[bs, S("llama")])
    assert 1 == third["launcher_stall_silence_seconds_count", S("llama", phase="weights")]
    assert 21.5 == third["launcher_stall_silence_seconds_sum", S("llama", phase="weights")]
    assert 1 == third["launcher_stall_silence_seconds_bucket", S("llama", phase="weights",
                                                                  le="30.0")]
    assert 0 == third["launcher_stall_silence_seconds_bucket", S("llama", phase="weights",
                                                                  le="20.0")]
    assert 2 == third["launcher_follow_failures_total", S("llama")]
    assert 1 == third["launcher_leader", L(lease="")]


async def test_rare_event_series_exist_at_zero_from_the_first_attempt(
    metrics: Metrics, served: MetricsServer
) -> None:
    """Restarts, follow failures and host outages have a 0 series once a server's first
    attempt started (so increase() sees their first event); a later attempt keeps counts."""
    metrics("llama", ev.AttemptStarted(attempt=1, params=NO_PARAMS))
    first = await scrape(served)
    metrics("llama", ev.RestartScheduled(delay_s=1.0, params=NO_PARAMS, attempt=1,
                                         restarts_left=4, restart_budget=5,
                                         restart_window_s=3600.0))
    metrics("llama", ev.HostLost(error="down", unreachable_s=0.0))
    metrics("llama", ev.AttemptStarted(attempt=2, params=NO_PARAMS))
    second = await scrape(served)
    names = ("launcher_restarts_total", "launcher_follow_failures_total",
             "launcher_host_unreachable_seconds_total", "launcher_host_unreachable")
    assert [0, 0, 0, 0] == [first[name, S("llama")] for name in names]
    assert [1, 0, 0, 1] == [second[name, S("llama")] for name in names]

"""Slack notifications: message content, delivery against a real HTTP server on 127.0.0.1
(retries, 429, hangs, overflow), dedupe of flapping, and redaction of secrets."""

from __future__ import annotations

import json
import logging
import random
import socket
from collections.abc import AsyncIterator, Callable, Iterator, MutableMapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from structlog.testing import capture_logs

from launcher.errors import ConfigError
from launcher.hooks.messages import (
    Kind,
    Origin,
    ServerInfo,
    adopted_message,
    checked_blocks,
    gave_up_message,
    ready_message,
    resolved_message,
    restart_message,
    unhealthy_message,
)
from launcher.hooks.slack import SlackNotifier
from launcher.sglang.classify import diagnose_text
from launcher.store.ledger import Ledger
from launcher.supervise import events as ev
from launcher.untrusted import Redactor
from tests.faketime import FakeTime as FakeClock  # its clock and sleep move together
from tests.httpsink import HANG, HttpSink, Reply

LOGS = Path(__file__).parents[1] / "data" / "logs"

HOOK_PATH = "/services/T0000AAAA/B0000BBBB/XXXXXXXXXXXXXXXXXXXXXXXX"
INFO = {
    "llama": ServerInfo(host="gpu1", model="meta-llama/Llama-3.1-70B-Instruct",
                        endpoint="10.0.0.5:30000", gpus="0,1", sglang_version="0.5.10"),
    "qwen": ServerInfo(host="gpu2", model="Qwen/Qwen2.5-7B-Instruct"),
}
CONFIG = "/etc/launcher/prod.toml"
BOX = "ops-box-1"
HF_TOKEN = "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ012345"


def failed(attempt: int, mfs: float, bs: int | None, outcome: str, phase: str) -> dict[str, Any]:
    """attempt.failed data as the supervisor emits it."""
    return {
        "attempt": attempt,
        "outcome": outcome,
        "confidence": "decisive",
        "phase": phase,
        # What the log showed: SGLang's own value of a param launcher left unset.
        "numbers": {"tried_gib": 2.0, "mem_fraction_static": mfs,
                    "cuda_graph_max_bs": 160 if bs is None else bs},
        "retryable": True,
        "after_ready": False,
        "evidence": [f"torch.OutOfMemoryError: CUDA out of memory (attempt {attempt})"],
        "advice": "",
    }


def record(mfs: float, bs: int | None, outcome: str, phase: str,
           attempt: int | None = None) -> dict[str, Any]:
    """One history entry of server.ready / server.gave_up (the supervisor's carry their
    attempt number; older data did not)."""
    entry: dict[str, Any] = {
        "params": {"mem_fraction_static": mfs, "cuda_graph_max_bs": bs},
        "outcome": outcome,
        "phase": phase,
    }
    if attempt is not None:
        entry["attempt"] = attempt
    return entry


READY = {
    "attempt": 3,
    "attempts": 3,
    "seconds": 432.4,
    "attempt_seconds": 100.0,
    "adopted": False,
    "params": {"mem_fraction_static": 0.78, "cuda_graph_max_bs": 96},
    "history": [
        record(0.88, None, "oom_graph_capture", "cuda_graph", attempt=1),
        record(0.83, 96, "oom_graph_capture", "cuda_graph", attempt=2),
    ],
}


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        yield server


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    # trust_env=False: a proxy set in the environment must not capture loopback requests.
    async with httpx.AsyncClient(trust_env=False) as c:
        yield c


def make(
    sink: HttpSink, client: httpx.AsyncClient, clock: FakeClock, **kwargs: Any
) -> SlackNotifier:
    options: dict[str, Any] = {"rng": random.Random(3), "post_timeout_s": 2.0,
                               "config_path": CONFIG, "box": BOX}
    options.update(kwargs)
    return SlackNotifier(
        sink.url(HOOK_PATH),
        servers_info=INFO,
        client=client,
        sleep=clock.sleep,
        clock=clock,
        **options,
    )


async def deliver(notifier: SlackNotifier, events: list[tuple[str, str, dict[str, Any]]]) -> None:
    """Run the worker, feed ``events`` to the hook, and drain before returning."""
    async with anyio.create_task_group() as tg:
        await tg.start(notifier.run)
        for server, event, data in events:
            notifier(server, ev.from_dict(event, data))
        await notifier.aclose(timeout_s=5.0)


async def until(condition: Callable[[], bool], timeout: float) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout`` seconds."""
    with anyio.fail_after(timeout):
        while True:
            if condition():
                return
            await anyio.sleep(0.01)


def texts(sink: HttpSink) -> list[str]:
    return [r.json()["text"] for r in sink.requests]


def events(logs: Sequence[MutableMapping[str, Any]], name: str) -> list[MutableMapping[str, Any]]:
    return [entry for entry in logs if entry["event"] == name]


# --- message content ----------------------------------------------------------------------


async def test_ready_message_names_params_attempts_time_and_each_failed_attempt(
    sink: HttpSink, client: httpx.AsyncClient
) -> None:
    """server.ready posts the working params, attempts, time to ready and the numbered failures."""
    notifier = make(sink, client, FakeClock())
    with capture_logs() as logs:
        await deliver(
            notifier,
            [
                (
                    "llama",
                    "attempt.failed",
                    failed(1, 0.88, None, "oom_graph_capture", "cuda_graph"),
                ),
                ("llama", "attempt.failed", failed(2, 0.83, 96, "oom_graph_capture", "cuda_graph")),
                ("llama", "server.ready", READY),
            ],
        )
    [request] = sink.requests
    assert ("POST", HOOK_PATH) == (request.method, request.path)
    body = request.json()
    assert (
        "llama is ready on gpu1 (meta-llama/Llama-3.1-70B-Instruct) with "
        "mem_fraction_static=0.780 cuda_graph_max_bs=96, attempt #3, 7m12s to ready. "
        "Failed attempts: "
        "#1 mem_fraction_static=0.880 cuda_graph_max_bs=160 (auto) → oom_graph_capture in "
        "cuda_graph; "
        "#2 mem_fraction_static=0.830 cuda_graph_max_bs=96 → oom_graph_capture in cuda_graph"
    ) == body["text"]
    blocks = body["blocks"]
    assert {"type": "plain_text", "text": ":white_check_mark: llama is ready", "emoji": True} == (
        blocks[0]["text"]
    )
    fields = [f["text"] for f in blocks[1]["fields"]]
    assert [
        "*Host*\ngpu1",
        "*Endpoint*\n10.0.0.5:30000",
        "*GPUs*\n0,1",
        "*Model*\nmeta-llama/Llama-3.1-70B-Instruct",
        "*SGLang*\n0.5.10",
        "*Attempt*\n#3",
        "*Params*\n`mem_fraction_static=0.780 cuda_graph_max_bs=96`",
        "*Time to ready*\n7m12s",
    ] == fields
    assert (
        "*Failed attempts*\n"
        "• #1 mem_fraction_static=0.880 cuda_graph_max_bs=160 (auto) → oom_graph_capture in "
        "cuda_graph\n"
        "• #2 mem_fraction_static=0.830 cuda_graph_max_bs=96 → oom_graph_capture in cuda_graph"
    ) == blocks[2]["text"]["text"]
    assert f"*Logs*\n```launcher logs {CONFIG} llama --attempt 3```" == blocks[3]["text"]["text"]
    assert [{"type": "mrkdwn", "text": f"sent by launcher on {BOX} · config `{CONFIG}`"}] == (
        blocks[4]["elements"])
    assert [{"server": "llama", "kind": "ready", "attempt": 1, "status": 200}] == [
        {k: e[k] for k in ("server", "kind", "attempt", "status")}
        for e in events(logs, "notify.sent")
    ]


async def test_gave_up_message_has_reason_ledger_evidence_and_advice(
    sink: HttpSink, client: httpx.AsyncClient
) -> None:
    """server.gave_up posts the reason, the ledger and the last failure's evidence and advice;
    the decisive line the reason quotes (and TP1 repeats) is shown once, in the evidence."""
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    last = failed(2, 0.5, 1, "oom_weights", "weights") | {
        "evidence": [
            "[2025-01-01 10:00:00 TP0] Load weight begin. avail mem=10.00 GB",
            oom,
            oom,
        ],
        "advice": "the weights do not fit: use more GPUs (tp) or a smaller model",
    }
    gave_up = {
        "reason": f"oom_weights in weights: the weights do not fit (log: {oom})",
        "attempt": 2,
        "attempts": 2,
        "history": [
            record(0.6, None, "oom_weights", "weights", attempt=1),
            record(0.5, 1, "oom_weights", "weights", attempt=2),
        ],
    }
    await deliver(
        make(sink, client, FakeClock()),
        [
            ("llama", "attempt.failed", failed(1, 0.6, None, "oom_weights", "weights")),
            ("llama", "attempt.failed", last),
            ("llama", "server.gave_up", gave_up),
        ],
    )
    body = sink.wait_for(1)[0].json()
    assert (
        "[FIRING] llama gave up on gpu1 (meta-llama/Llama-3.1-70B-Instruct) after 2 attempt(s) "
        "(last #2): oom_weights in weights: the weights do not fit. Last evidence: "
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    ) == body["text"]
    sections = [b["text"]["text"] for b in body["blocks"] if b["type"] == "section" and "text" in b]
    assert [
        "*Reason*\noom_weights in weights: the weights do not fit",
        "*Attempts*\n"
        "• #1 mem_fraction_static=0.600 cuda_graph_max_bs=160 (auto) → oom_weights in weights\n"
        "• #2 mem_fraction_static=0.500 cuda_graph_max_bs=1 → oom_weights in weights",
        "*Evidence* (attempt #2: oom_weights in weights)\n```"
        "[2025-01-01 10:00:00 TP0] Load weight begin. avail mem=10.00 GB\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB```",
        "*Advice*\nthe weights do not fit: use more GPUs (tp) or a smaller model",
        f"*Logs*\n```launcher logs {CONFIG} llama --attempt 2```",
    ] == sections
    assert ":x: [FIRING] llama gave up" == body["blocks"][0]["text"]["text"]
    assert 1 == json.dumps(body["blocks"]).count("Tried to allocate")
    fields = [f["text"] for f in body["blocks"][1]["fields"]]
    assert "*Params*\n`mem_fraction_static=0.500 cuda_graph_max_bs=1`" in fields


async def test_a_give_up_before_launching_names_no_earlier_attempt(
    sink: HttpSink, client: httpx.AsyncClient
) -> None:
    """A give-up in preflight (no attempt launched; ``attempt`` is an earlier run's) says
    "before launching", not "after 0 attempt(s) (last #7)", and points at no log."""
    reason = "preflight: port 30000 is already in use on gpu1 (uid 0 (root), pid 10 (python3))"
    gave_up = {"reason": reason, "attempt": 7, "attempts": 0, "history": []}
    await deliver(make(sink, client, FakeClock()), [("llama", "server.gave_up", gave_up)])
    body = sink.wait_for(1)[0].json()
    assert (
        "[FIRING] llama gave up on gpu1 (meta-llama/Llama-3.1-70B-Instruct) before launching: "
        + reason) == body["text"]
    assert "#7" not in json.dumps(body) and "*Logs*" not in json.dumps(body)


async def test_gave_up_shows_a_prescribed_fix_as_a_config_block(
    sink: HttpSink, client: httpx.AsyncClient
) -> None:
    """The TOML a prescribed fix ends the advice with is its own code block in Slack."""
    d = diagnose_text(
        (LOGS / "v0510_bad_argument_mamba_spec.log").read_text(), 1, sglang_version="0.5.23"
    )
    last = failed(1, 0.8, 32, "bad_argument", "init") | {"advice": d.advice}
    gave_up = {"reason": "bad_argument", "attempt": 1, "attempts": 1,
               "history": [record(0.8, 32, "bad_argument", "init", attempt=1)]}
    await deliver(
        make(sink, client, FakeClock()),
        [("llama", "attempt.failed", last), ("llama", "server.gave_up", gave_up)],
    )
    body = sink.wait_for(1)[0].json()
    sections = [b["text"]["text"] for b in body["blocks"] if b["type"] == "section" and "text" in b]
    assert sections[-1] == f"*Logs*\n```launcher logs {CONFIG} llama --attempt 1```"
    assert sections[-2] == (
        "*Config change*\n```# SGLang 0.5.23: --mamba-radix-cache-strategy extra_buffer "
        "(SGLANG_ENABLE_SPEC_V2 left out: SGLang 0.5.23 no longer reads it)\n[[servers]]\n"
        'mamba_strategy = "extra_buffer"```'
    )
    assert sections[-3].startswith("*Advice*\nSGLang rejected the command line")


RESTART = {"delay_s": 10.0, "params": READY["params"], "attempt": 4, "restarts_left": 2,
           "restart_budget": 3, "restart_window_s": 3600.0}
ILLEGAL = "RuntimeError: CUDA error: an illegal memory access was encountered"


async def test_an_alert_and_its_resolution_share_a_title(
    sink: HttpSink, client: httpx.AsyncClient
) -> None:
    """unhealthy → relaunched → ready: two [FIRING] messages, then one [RESOLVED] with the same
    title for each, saying how long it fired; another server's ready is a plain ready."""
    clock = FakeClock()
    died = failed(4, 0.78, 96, "cuda_error_other", "ready") | {
        "after_ready": True, "evidence": [ILLEGAL, ILLEGAL]}
    async with anyio.create_task_group() as tg:
        notifier = make(sink, client, clock)
        await tg.start(notifier.run)
        notifier("llama", ev.from_dict("server.ready", READY))
        notifier("llama", ev.from_dict("server.unhealthy",
                                       {"consecutive_failures": 3, "detail": "HTTP 503"}))
        notifier("llama", ev.from_dict("attempt.failed", died))
        notifier("llama", ev.from_dict("restart.scheduled", RESTART))
        clock.now += 95
        notifier("llama", ev.from_dict("server.ready",
                                       READY | {"attempt": 5, "attempts": 5, "seconds": 95.0}))
        notifier("qwen", ev.from_dict("server.ready", READY | {"history": []}))
        await notifier.aclose(timeout_s=5.0)
    headers = [r.json()["blocks"][0]["text"]["text"] for r in sink.requests]
    assert [
        ":white_check_mark: llama is ready",
        ":warning: [FIRING] llama is unhealthy",
        ":repeat: [FIRING] llama relaunched after ready",
        ":large_green_circle: [RESOLVED] llama is unhealthy",
        ":large_green_circle: [RESOLVED] llama relaunched after ready",
        ":white_check_mark: qwen is ready",
    ] == headers
    got = texts(sink)
    assert got[1] == ("[FIRING] llama is unhealthy on gpu1 (meta-llama/Llama-3.1-70B-Instruct): "
                      "3 failed health probes in a row (last: HTTP 503)")
    assert got[3] == (
        "[RESOLVED] llama is unhealthy: ready again on gpu1 (meta-llama/Llama-3.1-70B-Instruct) "
        "with mem_fraction_static=0.780 cuda_graph_max_bs=96, attempt #5, 1m35s to ready; "
        "fired for 1m35s")
    assert [] == notifier.firing()
    # The unhealthy message shows what was serving: the params and attempt of the last ready.
    unhealthy = sink.requests[1].json()["blocks"]
    assert "*Attempt*\n#3" in [f["text"] for f in unhealthy[1]["fields"]]
    assert f"launcher logs {CONFIG} llama --attempt 3" in json.dumps(unhealthy)


async def test_a_relaunch_shows_the_restart_budget_left_and_the_error_line_once(
    sink: HttpSink, client: httpx.AsyncClient
) -> None:
    """restart.scheduled: the budget the event reports, the failure's decisive log line (once,
    though two ranks printed it) and the failed attempt's logs command."""
    died = failed(4, 0.78, 96, "cuda_error_other", "ready") | {
        "after_ready": True, "evidence": ["Traceback (most recent call last):", ILLEGAL, ILLEGAL]}
    await deliver(make(sink, client, FakeClock()),
                  [("llama", "attempt.failed", died), ("llama", "restart.scheduled", RESTART)])
    body = sink.wait_for(1)[0].json()
    assert body["text"] == (
        "[FIRING] llama relaunched after ready on gpu1 (meta-llama/Llama-3.1-70B-Instruct) "
        "after cuda_error_other in ready: relaunching in 10s with mem_fraction_static=0.780 "
        f"cuda_graph_max_bs=96; 2 of 3 restarts per 1h left. Error: {ILLEGAL}")
    blocks = body["blocks"]
    assert "*Restart budget*\n2 of 3 restarts per 1h left" in [
        f["text"] for f in blocks[1]["fields"]]
    sections = [b["text"]["text"] for b in blocks if b["type"] == "section" and "text" in b]
    assert [
        "*Failure*\ncuda_error_other in ready",
        f"*Error*\n```{ILLEGAL}```",
        f"*Logs*\n```launcher logs {CONFIG} llama --attempt 4```",
    ] == sections
    assert 1 == json.dumps(blocks).count("illegal memory access")


async def test_a_relaunch_of_a_multi_node_server_names_the_node_that_failed(
    sink: HttpSink, client: httpx.AsyncClient
) -> None:
    """The cause of a multi-node server's relaunch is on node 1 (gpu-b): the message names that
    node and host, not only node 0's gpu1."""
    died = failed(4, 0.78, 96, "killed", "ready") | {
        "after_ready": True, "evidence": ["killed by signal 9 (SIGKILL); no error in the log"],
        "advice": "node 1 (gpu-b): killed by SIGKILL (the OOM killer, or someone)"}
    await deliver(make(sink, client, FakeClock()),
                  [("llama", "attempt.failed", died), ("llama", "restart.scheduled", RESTART)])
    body = sink.wait_for(1)[0].json()
    assert " after killed in ready on node 1 (gpu-b): relaunching in 10s" in body["text"], (
        body["text"])
    sections = [b["text"]["text"] for b in body["blocks"] if b["type"] == "section"
                and "text" in b]
    assert "*Failure*\nkilled in ready on node 1 (gpu-b)" in sections


async def test_a_firing_alert_is_reminded_until_resolved(
    sink: HttpSink, client: httpx.AsyncClient
) -> None:
    """A gave-up alert is posted again each remind_every_s with the same title and how long it
    has fired; once the server is ready it is resolved and no longer reminded."""
    clock = FakeClock()
    notifier = make(sink, client, clock, remind_every_s=3600.0)
    gave_up = {"reason": "oom_weights in weights", "attempt": 2, "attempts": 2, "history": []}
    async with anyio.create_task_group() as tg:
        await tg.start(notifier.run)
        notifier("llama", ev.from_dict("server.gave_up", gave_up))
        clock.now += 3599
        assert 0 == notifier.remind_due()
        clock.now += 1
        assert 1 == notifier.remind_due()
        assert 0 == notifier.remind_due()  # not again until another interval passed
        clock.now += 3600
        assert 1 == notifier.remind_due()
        notifier("llama", ev.from_dict("server.ready", READY | {"attempt": 3}))
        clock.now += 7200
        assert 0 == notifier.remind_due()
        await notifier.aclose(timeout_s=5.0)
    headers = [r.json()["blocks"][0]["text"]["text"] for r in sink.requests]
    assert [":x: [FIRING] llama gave up", ":bell: :x: [FIRING] llama gave up",
            ":bell: :x: [FIRING] llama gave up", ":large_green_circle: [RESOLVED] llama gave up",
            ] == headers
    got = texts(sink)
    assert got[1] == got[0] + " Reminder: still firing after 1h."
    assert got[2].endswith("Reminder: still firing after 2h.")
    assert got[3].endswith("; fired for 2h")
    assert 2 == notifier.reminded


async def test_the_worker_posts_reminders_on_its_own(
    sink: HttpSink, client: httpx.AsyncClient
) -> None:
    """No event needed: the worker looks for due reminders every reminder_poll_s."""
    clock = FakeClock()
    notifier = make(sink, client, clock, remind_every_s=60.0, reminder_poll_s=0.02)
    async with anyio.create_task_group() as tg:
        await tg.start(notifier.run)
        notifier("llama", ev.from_dict("server.unhealthy",
                                       {"consecutive_failures": 3, "detail": "x"}))
        await until(lambda: len(sink.requests) == 1, timeout=5)
        clock.now += 60
        await until(lambda: len(sink.requests) == 2, timeout=5)
        await notifier.aclose(timeout_s=5.0)
    assert texts(sink)[1].endswith("Reminder: still firing after 1m.")


async def test_other_events_send_nothing() -> None:
    """Events other than ready/gave_up/unhealthy/restart produce no message."""
    notifier = SlackNotifier(None, servers_info=INFO)
    with capture_logs() as logs:
        notifier("llama", ev.from_dict("probe.result",
                                       {"ok": True, "latency_s": 0.01, "detail": "HTTP 200"}))
        notifier("llama", ev.from_dict("phase.entered", {"phase": "weights", "attempt": 1}))
        notifier("llama", ev.from_dict("attempt.failed",
                                       failed(1, 0.8, None, "oom_kv_cache", "kv_cache")))
        notifier("llama", ev.from_dict("server.stopped",
                                       {"reason": "stop requested", "left_running": None}))
    assert [] == logs


# --- delivery -----------------------------------------------------------------------------


async def test_429_waits_exactly_what_retry_after_says(
    sink: HttpSink, client: httpx.AsyncClient
) -> None:
    """A 429 with Retry-After: 7 sleeps 7 s (no jitter) and then delivers the same payload."""
    sink.script(Reply.too_many(retry_after=7))
    clock = FakeClock()
    with capture_logs() as logs:
        await deliver(make(sink, client, clock), [("llama", "server.ready", READY)])
    assert [7.0] == clock.sleeps
    first, second = sink.wait_for(2)
    assert first.body == second.body
    [retry] = events(logs, "notify.retry")
    assert (1, 7.0) == (retry["attempt"], retry["wait_s"])
    assert retry["cause"].startswith("HTTP 429")
    assert [2] == [e["attempt"] for e in events(logs, "notify.sent")]


async def test_500_is_retried_with_jittered_exponential_backoff_then_sent(
    sink: HttpSink, client: httpx.AsyncClient
) -> None:
    """Two 500s are retried after waits in [0.5, 1] and [1, 2] s; the third try is sent."""
    sink.script(Reply.error(500), Reply.error(503))
    clock = FakeClock()
    notifier = make(sink, client, clock)
    await deliver(notifier, [("llama", "server.ready", READY)])
    assert 3 == len(sink.wait_for(3))
    first, second = clock.sleeps
    assert 0.5 <= first <= 1.0
    assert 1.0 <= second <= 2.0
    assert (1, 0) == (notifier.sent, notifier.abandoned)


async def test_permanent_4xx_is_not_retried(sink: HttpSink, client: httpx.AsyncClient) -> None:
    """A 404 "no_service" (webhook revoked) is logged as rejected after one try."""
    sink.script(Reply.error(404, b"no_service"))
    clock = FakeClock()
    with capture_logs() as logs:
        await deliver(make(sink, client, clock), [("llama", "server.ready", READY)])
    assert 1 == len(sink.requests)
    assert [] == clock.sleeps
    [rejected] = events(logs, "notify.rejected")
    assert (404, "HTTP 404: no_service") == (rejected["status"], rejected["cause"])


async def test_connection_refused_is_retried_then_abandoned(client: httpx.AsyncClient) -> None:
    """A webhook nobody listens on is retried max_tries times and abandoned with the cause."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed on leaving the block: nothing listens there
    clock = FakeClock()
    notifier = SlackNotifier(
        f"http://127.0.0.1:{port}{HOOK_PATH}",
        servers_info=INFO,
        client=client,
        sleep=clock.sleep,
        clock=clock,
        max_tries=3,
    )
    with capture_logs() as logs:
        await deliver(notifier, [("llama", "server.ready", READY)])
    assert 2 == len(clock.sleeps)
    [abandoned] = events(logs, "notify.abandoned")
    assert (3, "max_tries") == (abandoned["attempts"], abandoned["bound"])
    assert abandoned["cause"].startswith("ConnectError")


async def test_total_time_bound_abandons_before_max_tries(
    sink: HttpSink, client: httpx.AsyncClient
) -> None:
    """With 5xx forever, retries stop when the next wait would pass max_total_s."""
    sink.default = Reply.error(500)
    clock = FakeClock()
    notifier = make(sink, client, clock, max_tries=50, max_total_s=10.0)
    with capture_logs() as logs:
        await deliver(notifier, [("llama", "server.ready", READY)])
    [abandoned] = events(logs, "notify.abandoned")
    assert "max_total_s" == abandoned["bound"]
    assert sum(clock.sleeps) <= 10.0
    assert len(sink.requests) == len(clock.sleeps) + 1 < 50


async def test_hanging_webhook_times_out_is_retried_and_abandoned_while_the_hook_stays_free(
    sink: HttpSink, client: httpx.AsyncClient
) -> None:
    """Each hung POST ends at post_timeout_s; after max_tries it is abandoned; hooks never wait
    (a hook call returns with the message queued while the POST before it hangs)."""
    sink.default = HANG
    clock = FakeClock()
    notifier = make(sink, client, clock, post_timeout_s=0.2, max_tries=2)
    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            await tg.start(notifier.run)
            notifier("llama", ev.from_dict("server.ready", READY))
            await sink.wait_for_async(1)
            notifier("qwen", ev.from_dict("server.ready", READY))  # queued behind the stuck one
            queued_while_stuck = (notifier.pending, len(sink.requests))
            await until(lambda: notifier.abandoned == 1, timeout=3.0)
            tg.cancel_scope.cancel()
    assert (1, 1) == queued_while_stuck  # returned at once: queued, the first POST still hung
    [abandoned] = events(logs, "notify.abandoned")
    assert ("llama", 2, "max_tries") == (
        abandoned["server"],
        abandoned["attempts"],
        abandoned["bound"],
    )
    assert abandoned["cause"].startswith("timeout")
    assert 1 == len(clock.sleeps)


async def test_hook_returns_at_once_while_the_worker_is_stuck_and_aclose_is_bounded(
    sink: HttpSink, client: httpx.AsyncClient
) -> None:
    """200 hook calls during a hung POST all return with their messages queued; aclose gives
    up after its timeout with the POST still hung and reports what it could not send."""
    sink.default = HANG
    notifier = make(sink, client, FakeClock(), post_timeout_s=30.0, max_queue=500)
    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            await tg.start(notifier.run)
            notifier("llama", ev.from_dict("server.ready", READY))
            await sink.wait_for_async(1)
            for i in range(200):
                notifier(f"s{i}", ev.from_dict("server.unhealthy",
                                               {"consecutive_failures": 3, "detail": "x"}))
            assert 200 == notifier.pending
            await notifier.aclose(timeout_s=0.3)  # the hung POST would take 30 s
    [unsent] = events(logs, "notify.unsent")
    assert 200 == unsent["count"]
    assert 1 == len(sink.requests)


async def test_queue_overflow_drops_the_oldest(sink: HttpSink, client: httpx.AsyncClient) -> None:
    """With max_queue=3, five messages keep the newest three and log two drops."""
    notifier = make(sink, client, FakeClock(), max_queue=3)
    servers = [f"s{i}" for i in range(5)]
    with capture_logs() as logs:
        for server in servers:  # no worker yet: everything waits in the queue
            notifier(server, ev.from_dict("server.ready", READY))
        await notifier.aclose(timeout_s=5.0)  # drains here, bounded
    assert [("s0", 1), ("s1", 2)] == [
        (e["server"], e["dropped_total"]) for e in events(logs, "notify.dropped")
    ]
    assert 2 == notifier.dropped
    assert ["s2", "s3", "s4"] == [t.split(" ")[0] for t in texts(sink)]


async def test_flapping_is_suppressed_and_the_next_message_counts_it(
    sink: HttpSink, client: httpx.AsyncClient
) -> None:
    """Repeats of (server, kind) inside the window are held back, and so is the resolution of
    an alert that was held back; the next message of that server says how many."""
    clock = FakeClock()
    notifier = make(sink, client, clock, dedupe_window_s=600.0)
    unhealthy = {"consecutive_failures": 3, "detail": "HTTP 503"}
    cycle = [
        ("llama", "server.unhealthy", unhealthy),
        ("llama", "restart.scheduled", RESTART),
        ("llama", "server.ready", READY),
    ]
    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            await tg.start(notifier.run)
            for _ in range(3):
                for server, event, data in cycle:
                    notifier(server, ev.from_dict(event, data))
                clock.now += 60  # a flap a minute
            clock.now += 600  # past the window of the first messages
            notifier("llama", ev.from_dict("server.unhealthy", unhealthy))
            notifier("qwen", ev.from_dict("server.unhealthy",
                                          unhealthy))  # another server: own window
            await notifier.aclose(timeout_s=5.0)
    headers = [r.json()["blocks"][0]["text"]["text"] for r in sink.requests]
    assert [
        ":warning: [FIRING] llama is unhealthy",
        ":repeat: [FIRING] llama relaunched after ready",
        ":large_green_circle: [RESOLVED] llama is unhealthy",
        ":large_green_circle: [RESOLVED] llama relaunched after ready",
        ":warning: [FIRING] llama is unhealthy",
        ":warning: [FIRING] qwen is unhealthy",
    ] == headers
    got = texts(sink)
    # Two later cycles, each: unhealthy, relaunched, and their two resolutions.
    assert got[4].endswith("(8 similar suppressed)")
    assert {"type": "mrkdwn", "text": "(8 similar suppressed)"} == (
        sink.requests[4].json()["blocks"][-2]["elements"][0]
    )
    assert "suppressed" not in got[5]
    assert 8 == notifier.suppressed == len(events(logs, "notify.suppressed"))


async def test_dedupe_and_firing_alerts_survive_a_restart(
    sink: HttpSink, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    """The memory lives in the ledger (real SQLite): a second notifier on the same ledger holds
    back a repeat inside the window, resolves the alert the first one announced, and reminds
    an alert that fell due while no launcher ran."""
    clock = FakeClock()
    gave_up = {"reason": "oom_weights in weights", "attempt": 2, "attempts": 2, "history": []}
    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        first = make(sink, client, clock)
        first.bind_store(ledger)
        await deliver(first, [("llama", "server.gave_up", gave_up),
                              ("qwen", "server.unhealthy",
                               {"consecutive_failures": 3, "detail": "HTTP 503"})])
    clock.now += 120
    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        second = make(sink, client, clock, remind_every_s=3600.0)
        second.bind_store(ledger)
        assert [("llama", Kind.GAVE_UP), ("qwen", Kind.UNHEALTHY)] == second.firing()
        await deliver(second, [("llama", "server.gave_up", gave_up),
                               ("llama", "server.ready", READY | {"attempt": 3})])
    clock.now += 3600
    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        third = make(sink, client, clock, remind_every_s=3600.0)
        third.bind_store(ledger)
        await deliver(third, [])  # the worker's start looks for due reminders
    headers = [r.json()["blocks"][0]["text"]["text"] for r in sink.requests]
    assert [
        ":x: [FIRING] llama gave up",
        ":warning: [FIRING] qwen is unhealthy",
        ":large_green_circle: [RESOLVED] llama gave up",
        ":bell: :warning: [FIRING] qwen is unhealthy",
    ] == headers
    assert 1 == second.suppressed
    assert texts(sink)[2].endswith("(1 similar suppressed)")
    assert texts(sink)[3].endswith("Reminder: still firing after 1h2m.")


async def test_a_message_only_logged_does_not_hold_back_a_delivered_one(
    sink: HttpSink, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    """A launcher without a webhook logs its messages; once a webhook is added, the next
    launcher on the same ledger posts the same alert at once, not after the window."""
    clock = FakeClock()
    gave_up = {"reason": "oom_weights in weights", "attempt": 2, "attempts": 2, "history": []}
    with Ledger(tmp_path / "ledger.sqlite3") as ledger, capture_logs() as logs:
        logged_only = SlackNotifier(None, servers_info=INFO, clock=clock, config_path=CONFIG,
                                    box=BOX)
        logged_only.bind_store(ledger)
        logged_only("llama", ev.from_dict("server.gave_up", gave_up))
        logged_only("llama", ev.from_dict("server.gave_up", gave_up))  # held back in-process
    assert 1 == len(events(logs, "notify.message"))
    assert 1 == logged_only.suppressed
    clock.now += 120
    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        delivering = make(sink, client, clock)
        delivering.bind_store(ledger)
        await deliver(delivering, [("llama", "server.gave_up", gave_up)])
    assert [":x: [FIRING] llama gave up"] == [
        r.json()["blocks"][0]["text"]["text"] for r in sink.requests]
    assert 0 == delivering.suppressed


async def test_a_payload_slack_would_reject_is_posted_as_text(
    sink: HttpSink, client: httpx.AsyncClient
) -> None:
    """Blocks that break Slack's limits (slack_sdk's models say so) are not posted: the text is,
    and notify.invalid_blocks says why."""
    notifier = make(sink, client, FakeClock())
    message = ready_message("llama", INFO["llama"], ev.from_dict("server.ready", READY))
    too_many = {"type": "section", "fields": [{"type": "mrkdwn", "text": "x"}] * 11}
    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            await tg.start(notifier.run)
            notifier._enqueue(replace(message, blocks=[*message.blocks, too_many]))
            await notifier.aclose(timeout_s=5.0)
    assert [{"text": message.text}] == [r.json() for r in sink.requests]
    [invalid] = events(logs, "notify.invalid_blocks")
    assert "fields attribute cannot exceed 10 items" in invalid["error"]


def test_every_message_carries_the_facts_and_fits_slack() -> None:
    """Each kind of message names host, endpoint, GPUs, model, SGLang version, params in
    numbers, the logs command and who sent it, and passes slack_sdk's checks even with an
    overlong server name and reason."""
    origin = Origin(box=BOX, config=CONFIG)
    name = "llama" + "-x" * 100
    info = INFO["llama"]
    auto = {"mem_fraction_static": None, "cuda_graph_max_bs": None}
    ready = READY | {"params": auto, "resolved": {"mem_fraction_static": 0.812,
                                                  "cuda_graph_max_bs": 48}}
    died = failed(3, 0.78, 96, "hang", "ready")
    ready_event = ev.from_dict("server.ready", ready)
    died_event = ev.from_dict("attempt.failed", died)
    messages = [
        ready_message(name, info, ready_event, origin=origin),
        resolved_message(name, Kind.UNHEALTHY, info, ready_event, firing_s=75.0, origin=origin),
        gave_up_message(name, info, ev.from_dict("server.gave_up", {
                            "reason": "r" * 5000, "attempt": 3, "attempts": 3, "history": []}),
                        failures=[died_event], origin=origin),
        unhealthy_message(name, info, ev.from_dict("server.unhealthy", {
                              "consecutive_failures": 3, "detail": ""}),
                          ready=ready_event, origin=origin),
        restart_message(name, info, ev.from_dict("restart.scheduled",
                                                 RESTART | {"params": auto, "attempt": 3}),
                        last_failure=died_event, ready=ready_event, origin=origin),
        adopted_message(name, info, ev.from_dict("server.adopted", {
                            "pid": 1, "attempt": 3, "params": READY["params"],
                            "started_at": None}),
                        origin=origin),
    ]
    for message in messages:
        checked = checked_blocks(message.blocks)
        fields = [f["text"] for f in checked[1]["fields"]]
        for label, value in [("Host", "gpu1"), ("Endpoint", "10.0.0.5:30000"), ("GPUs", "0,1"),
                             ("Model", info.model), ("SGLang", "0.5.10"), ("Attempt", "#3")]:
            assert f"*{label}*\n{value}" in fields, (message.kind, fields)
        params = next(f for f in fields if f.startswith("*Params*"))
        assert "auto`" not in params and "=auto" not in params, params
        dump = json.dumps(checked)
        assert f"launcher logs {CONFIG} {name} --attempt 3" in dump, message.kind
        sender = checked[-1]["elements"][0]["text"]
        assert f"sent by launcher on {BOX} · config `{CONFIG}`" == sender
        assert len(checked[0]["text"]["text"]) <= 150
    assert "mem_fraction_static=0.812 (auto) cuda_graph_max_bs=48 (auto)" in messages[0].text


# --- secrets and the log-only mode ---------------------------------------------------------


async def test_secrets_are_masked_in_payloads_and_logs(
    sink: HttpSink, client: httpx.AsyncClient
) -> None:
    """Secret values and the webhook URL become *** in what is posted and in every log event."""
    url = sink.url(HOOK_PATH)
    sink.script(Reply.error(400, f"invalid_payload {HF_TOKEN} {url}".encode()))
    notifier = SlackNotifier(
        url,
        servers_info=INFO,
        secrets=[HF_TOKEN, "pw"],  # too short to mask: it would hit ordinary words
        client=client,
    )
    leaky = failed(1, 0.8, None, "model_not_found", "init") | {
        "evidence": [f"401 Client Error for https://huggingface.co/x?token={HF_TOKEN}"],
        "advice": f"check HF_TOKEN={HF_TOKEN} and {url}",
    }
    with capture_logs() as logs:
        await deliver(
            notifier,
            [
                ("llama", "attempt.failed", leaky),
                ("llama", "server.gave_up", {"reason": f"bad {HF_TOKEN}", "attempt": 1,
                                             "attempts": 1, "history": []}),
                ("llama", "server.unhealthy", {"consecutive_failures": 1, "detail": HF_TOKEN}),
            ],
        )
    bodies = [r.body.decode() for r in sink.wait_for(2)]
    everything = "\n".join([*bodies, repr(logs)])
    assert HF_TOKEN not in everything
    assert url not in everything
    assert HOOK_PATH.strip("/") not in everything
    assert "token=***" in bodies[0]
    assert "check HF_TOKEN=*** and ***" in bodies[0]
    assert "HTTP 400: invalid_payload *** ***" == events(logs, "notify.rejected")[0]["cause"]


async def test_the_webhook_url_stays_out_of_httpx_logs(
    sink: HttpSink, caplog: pytest.LogCaptureFixture
) -> None:
    """httpx logs each request's URL; while the worker runs those records are masked."""
    caplog.set_level(logging.DEBUG)
    notifier = SlackNotifier(sink.url(HOOK_PATH), servers_info=INFO)  # its own client
    await deliver(notifier, [("llama", "server.ready", READY)])
    assert 1 == len(sink.requests)
    assert "HTTP Request: POST ***" in caplog.text
    assert HOOK_PATH.strip("/") not in caplog.text


async def test_without_a_webhook_messages_go_to_the_log_only() -> None:
    """webhook_url None logs notify.message with the text and, as ``details``, everything
    else the message says (the facts every message names, the secret still masked), and makes
    no HTTP request."""
    calls: list[httpx.Request] = []

    def record_call(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(200)

    async with httpx.AsyncClient(transport=httpx.MockTransport(record_call)) as spy:
        notifier = SlackNotifier(None, servers_info=INFO, secrets=[HF_TOKEN], client=spy)
        with capture_logs() as logs:
            await deliver(
                notifier,
                [("llama", "server.unhealthy", {"consecutive_failures": 3, "detail": HF_TOKEN})],
            )
    assert [] == calls
    assert [
        {
            "event": "notify.message",
            "log_level": "info",
            "server": "llama",
            "kind": "unhealthy",
            "text": "[FIRING] llama is unhealthy on gpu1 (meta-llama/Llama-3.1-70B-Instruct): "
            "3 failed health probes in a row (last: ***)",
            "details": [
                ":warning: [FIRING] llama is unhealthy", "Host: gpu1",
                "Endpoint: 10.0.0.5:30000", "GPUs: 0,1",
                "Model: meta-llama/Llama-3.1-70B-Instruct", "SGLang: 0.5.10", "Attempt: ?",
                "Params: unknown params", "3 failed health probes in a row (last: ***)",
                "sent by launcher on vm · config CONFIG",
            ],
        }
    ] == logs


def test_a_webhook_that_is_not_a_url_is_a_config_error_that_hides_the_value() -> None:
    """A malformed webhook fails at construction without echoing the (secret) value."""
    with pytest.raises(ConfigError) as caught:
        SlackNotifier("hooks.slack.com/services/T0/B0/SECRETSECRET", servers_info=INFO)
    assert "SECRETSECRET" not in str(caught.value)
    assert "slack.webhook_url" in str(caught.value)


def test_redactor_masks_longest_first_deep_and_in_slack_escaped_form() -> None:
    """A secret inside a longer one is masked whole; nested values and &amp; forms are masked."""
    redact = Redactor(["tok&en1234", "tok&en1234-extended", "abc"])
    assert {"k": ["*** and ***", 3, None], "***": "x"} == redact(
        {"k": ["tok&en1234-extended and tok&amp;en1234", 3, None], "tok&en1234": "x"}
    )
    assert "abc stays: too short to be a secret" == redact.text(
        "abc stays: too short to be a secret"
    )


def test_ledger_without_failures_keeps_auto_params_and_is_capped() -> None:
    """Without attempt.failed data an "auto" param stays auto (numbered by the history's own
    attempt numbers: a typed history entry always carries one); past 15 entries it elides."""
    history = [record(0.9 - i * 0.01, None, "oom_kv_cache", "kv_cache", attempt=i + 1)
               for i in range(20)]
    message = ready_message("qwen", INFO["qwen"],
                            ev.from_dict("server.ready", READY | {"history": history}))
    ledger = message.blocks[2]["text"]["text"].split("\n")
    assert "*Failed attempts*" == ledger[0]
    assert "• … 5 earlier attempt(s)" == ledger[1]
    assert (
        "• #6 mem_fraction_static=0.850 cuda_graph_max_bs=auto → oom_kv_cache in kv_cache"
        == (ledger[2])
    )
    assert 17 == len(ledger)


def test_ready_numbers_attempts_as_the_host_does() -> None:
    """A daemon restarted after attempts 1-3 fails #4 and #5 and gets #6 ready: Slack says
    attempt #6 and lists #4 and #5, the numbers of the run directories and the ledger (the
    bug: the per-run count, "attempt 3", and failures numbered from another run)."""
    history = [
        record(0.88, None, "oom_graph_capture", "cuda_graph") | {"attempt": 4},
        record(0.83, 96, "oom_graph_capture", "cuda_graph") | {"attempt": 5},
    ]
    data = READY | {"attempt": 6, "attempts": 3, "history": history}
    # attempt.failed data of an earlier run that happen to line up in outcome and phase
    stale = [failed(2, 0.9, None, "oom_graph_capture", "cuda_graph"),
             failed(3, 0.9, None, "oom_graph_capture", "cuda_graph")]

    message = ready_message("llama", INFO["llama"], ev.from_dict("server.ready", data),
                            failures=[ev.from_dict("attempt.failed", f) for f in stale])

    assert ", attempt #6, 7m12s to ready. Failed attempts: #4 mem_fraction_static=0.880" in (
        message.text)
    assert "; #5 mem_fraction_static=0.830" in message.text
    assert "*Attempt*\n#6" in [f["text"] for f in message.blocks[1]["fields"]]


async def test_an_adopted_server_is_no_fresh_ready(
    sink: HttpSink, client: httpx.AsyncClient
) -> None:
    """server.adopted and the adopted attempt's server.ready post nothing by default; with
    announce_adoption one "adopted" message names the real attempt number and pid."""
    adopted = {"pid": 4242, "attempt": 7, "params": READY["params"], "started_at": 1.0}
    ready = READY | {"attempt": 7, "attempts": 1, "seconds": None, "adopted": True,
                     "history": []}
    await deliver(make(sink, client, FakeClock()),
                  [("llama", "server.adopted", adopted), ("llama", "server.ready", ready)])
    assert [] == sink.requests

    await deliver(make(sink, client, FakeClock(), announce_adoption=True),
                  [("llama", "server.adopted", adopted), ("llama", "server.ready", ready)])
    assert [
        "llama adopted on gpu1 (meta-llama/Llama-3.1-70B-Instruct): attempt #7 (pid 4242) is "
        "still running with mem_fraction_static=0.780 cuda_graph_max_bs=96; supervising it "
        "again, nothing relaunched"
    ] == texts(sink)


def test_the_clipping_limits_are_within_slack_sdks() -> None:
    """What this module clips to stays within the limits slack_sdk's models check (they are
    not imported at module load: see checked_blocks)."""
    from slack_sdk.models.blocks import HeaderBlock, SectionBlock

    from launcher.hooks import messages

    assert messages._HEADER_MAX <= HeaderBlock.text_max_length
    assert messages._SECTION_MAX <= SectionBlock.text_max_length


def test_a_relaunch_after_an_unrecorded_kill_names_the_kill_not_an_access_line() -> None:
    """A server killed by SIGKILL while serving leaves access lines last in its log; the
    relaunch message's error is the kill, not ``GET /health ... 200 OK``."""
    log = (
        "[2026-03-02 10:01:00] The server is fired up and ready to roll!\n"
        '[2026-03-02 10:02:01] INFO:     127.0.0.1:51234 - "GET /health HTTP/1.1" 200 OK\n'
    )
    d = diagnose_text(log, 137)
    died = failed(2, 0.8, 96, d.outcome.value, "ready") | {
        "evidence": list(d.evidence[-3:]), "after_ready": True}
    message = restart_message("llama", INFO["llama"], ev.from_dict("restart.scheduled", RESTART),
                              last_failure=ev.from_dict("attempt.failed", died))
    assert message.text.endswith(". Error: killed by signal 9 (SIGKILL); no error in the log")
    assert "GET /health" not in json.dumps(message.payload())

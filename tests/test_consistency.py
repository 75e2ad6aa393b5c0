"""One story everywhere: a server's attempts as the ledger (the SQLite file itself), `launcher
history`, `launcher status`, Slack (a local webhook receiver), the metrics endpoint, the JSON
event log and the run directories tell them, across a launcher crash and an adoption.

The run: attempt 1 runs out of memory capturing CUDA graphs, attempt 2 dies of an NCCL error
in init (an injected fault: the OOM policy now converges in one step), attempt 3 gets ready;
launcher is SIGKILLed; a new launcher adopts attempt 3; the server is SIGKILLed;
launcher relaunches it as attempt 4, which gets ready; launcher is stopped with SIGTERM.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.httpsink import HttpSink
from tests.simhost import free_port
from tests.supervise import SERVER, SimSetup, cli_argv, cli_env, run_cli

pytestmark = pytest.mark.timeout(150)

HOOK = "/services/T000/B000/consistency-test-hook"


def start_up(config: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        cli_argv("up", str(config), "--log-format", "json"), env=cli_env(env),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )


def read_events(proc: subprocess.Popen[str], seen: list[dict[str, Any]],
                until: Callable[[dict[str, Any]], bool], timeout: float = 60.0) -> dict[str, Any]:
    """Read ``proc``'s JSON event lines into ``seen`` up to the first one ``until`` accepts."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if not line.startswith("{"):
            continue
        event = json.loads(line)
        seen.append(event)
        if until(event):
            return event
    names = [e.get("event") for e in seen]
    raise AssertionError(f"the awaited event never came; got {names}")


def named(name: str, **data: Any) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e.get("event") == name and all(e.get(k) == v for k, v in data.items())


def scrape(port: int) -> str:
    return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5.0, trust_env=False).text


def metric(text: str, name: str) -> float:
    """The value of ``name`` for SERVER, read with prometheus_client's own parser."""
    values = [sample.value for family in text_string_to_metric_families(text)
              for sample in family.samples
              if sample.name == name and sample.labels.get("server") == SERVER]
    assert 1 == len(values), f"{name} of {SERVER} not (once) in the metrics"
    return values[0]


def test_attempts_tell_one_story_across_a_crash_an_adoption_and_a_relaunch(
    sim: SimSetup,
) -> None:
    metrics_port = free_port()
    data = sim.data(model="llama-70b-sim", tp=2, mem_fraction_static=0.99,
                    cuda_graph_max_bs=512, faults=[{"kind": "nccl_error", "attempts": [2]}])
    data["metrics"] = {"listen": f"127.0.0.1:{metrics_port}"}
    config = sim.write_toml(data)
    with HttpSink() as slack:
        env = {"LAUNCHER_SLACK_WEBHOOK": slack.url(HOOK)}

        # -- the first launcher: OOM, NCCL error, ready; then SIGKILL --------------------------
        first = start_up(config, env)
        seen_first: list[dict[str, Any]] = []
        try:
            ready_first = read_events(first, seen_first, named("server.ready"))
            slack.wait_for(1, timeout=20)
            # The ledger's row is written by a worker after the event is logged; the crash
            # comes once it holds the time to ready (what this test checks it keeps).
            ledger_row_ready(sim.state_dir / "ledger.sqlite3", ready_first["attempt"])
            os.killpg(first.pid, signal.SIGKILL)
            first.communicate(timeout=10)
        finally:
            if first.poll() is None:
                first.kill()
                first.communicate()
        failed_first = [e for e in seen_first if e["event"] == "attempt.failed"]
        assert len(failed_first) >= 2, [e["event"] for e in seen_first]
        outcomes = [f["outcome"] for f in failed_first]
        # The capture OOM first; then the NCCL fault of attempt 2, unless the policy's second
        # fraction already runs out in warmup (oom_runtime: the fault then never fires). The
        # story this test checks is the numbering, whatever the failures were.
        assert "oom_graph_capture" == outcomes[0], outcomes
        assert set(outcomes[1:]) <= {"nccl_error", "oom_runtime", "oom_graph_capture"}, outcomes
        n_ready = ready_first["attempt"]
        assert len(failed_first) + 1 == n_ready
        assert sim.alive(n_ready)

        # -- the second launcher: adopt, the server is SIGKILLed, relaunch, ready ----------
        second = start_up(config, env)
        seen: list[dict[str, Any]] = []
        try:
            adopted = read_events(second, seen, named("server.adopted"))
            adopted_ready = read_events(second, seen, named("server.ready"))
            os.killpg(sim.pid(n_ready), signal.SIGKILL)
            relaunched = read_events(second, seen, named("server.ready", attempt=n_ready + 1))
            metrics_text = scrape(metrics_port)
            time.sleep(0.5)  # the ledger writer and Slack worker catch up
            second.send_signal(signal.SIGTERM)
            _, stderr = second.communicate(timeout=30)
        finally:
            if second.poll() is None:
                second.kill()
                second.communicate()
        assert 0 == second.returncode, stderr
        n_last = n_ready + 1

        # -- the events -----------------------------------------------------------------
        assert (n_ready, sim.pid(n_ready)) == (adopted["attempt"], adopted["pid"])
        assert (n_ready, True, None) == (adopted_ready["attempt"], adopted_ready["adopted"],
                                         adopted_ready["seconds"])
        [died] = [e for e in seen if e["event"] == "attempt.failed"]
        assert (n_ready, True) == (died["attempt"], died["after_ready"])
        [started] = [e["attempt"] for e in seen if e["event"] == "attempt.started"]
        assert n_last == started
        assert not relaunched["adopted"] and relaunched["attempt_seconds"] > 0
        assert {n_ready, n_last} == {e["attempt"] for e in seen if "attempt" in e
                                     and e["event"] in ("phase.entered", "attempt.started",
                                                        "attempt.failed", "server.ready")}
        assert list(range(1, n_last + 1)) == sim.attempts()  # the run directories

        # -- the ledger, read from the SQLite file itself -------------------------------
        db = sqlite3.connect(sim.state_dir / "ledger.sqlite3")
        rows = db.execute(
            "SELECT attempt, outcome, phase, seconds_to_ready, mem_fraction_static, "
            "cuda_graph_max_bs FROM attempts WHERE server = ? ORDER BY attempt", (SERVER,),
        ).fetchall()
        db.close()
        expected = [(f["attempt"], f["outcome"], f["phase"]) for f in failed_first]
        expected += [(n_ready, died["outcome"], died["phase"]), (n_last, "ready", "ready")]
        assert expected == [r[:3] for r in rows]
        # Time to ready: none for the attempts that failed before ready; attempt n_ready keeps
        # what the first launcher measured (no "40 ms" from the adoption), n_last its own.
        seconds = {r[0]: r[3] for r in rows}
        assert [None] * len(failed_first) == [seconds[f["attempt"]] for f in failed_first]
        assert ready_first["attempt_seconds"] == pytest.approx(seconds[n_ready], abs=0.05)
        assert relaunched["attempt_seconds"] == pytest.approx(seconds[n_last], abs=0.05)
        params = {r[0]: {"mem_fraction_static": r[4], "cuda_graph_max_bs": r[5]} for r in rows}
        assert ready_first["params"] == params[n_ready] == params[n_last]

        # -- `launcher history` and `launcher status` -----------------------------------
        hist = run_cli("history", "--config", str(config), "--json")
        assert 0 == hist.returncode, hist.stderr
        assert sorted((r[0], r[1], r[3]) for r in rows) == sorted(
            (h["attempt"], h["outcome"], h["seconds_to_ready"]) for h in json.loads(hist.stdout))
        status = run_cli("status", str(config), "--json")
        [row] = json.loads(status.stdout)
        assert (True, True, n_last, sim.pid(n_last)) == (
            row["running"], row["ready"], row["attempt"], row["pid"])
        assert n_last == metric(metrics_text, "launcher_server_attempt")

        # -- Slack ------------------------------------------------------------------------
        texts = [r.json()["text"] for r in slack.requests]
        blocks = [json.dumps(r.json()["blocks"]) for r in slack.requests]
        info = [line for family in text_string_to_metric_families(metrics_text)
                for line in family.samples if line.name == "launcher_server_info"]
    failed_list = "; ".join(f"#{f['attempt']} " for f in failed_first)
    assert 3 == len(texts), texts  # ready; nothing on adoption; relaunched; resolved
    # Each message names the SGLang version launcher uses, the model by name and how to read
    # the attempt's log; the metrics' info series says the same.
    logs_line = f"launcher logs {config} {SERVER} --attempt"
    for number, text in zip([n_ready, died["attempt"], n_last], blocks, strict=True):
        assert "*SGLang*\\n0.5.23" in text and "*Model*\\nllama-70b-sim" in text, text
        assert f"{logs_line} {number}" in text, text
    [labels] = [sample.labels for sample in info]
    assert ("0.5.23", "llama-70b-sim") == (labels["sglang_version"], labels["model"])
    assert f", attempt #{n_ready}, " in texts[0] and texts[0].startswith(f"{SERVER} is ready")
    assert [f"#{f['attempt']} " for f in failed_first] == re.findall(r"#\d+ ", texts[0].split(
        "Failed attempts: ")[1]), (failed_list, texts[0])
    assert texts[1].startswith(f"[FIRING] {SERVER} relaunched after ready")
    assert died["outcome"] in texts[1]
    assert texts[2].startswith(f"[RESOLVED] {SERVER} relaunched after ready: ready again")
    assert f", attempt #{n_last}, " in texts[2]
    # Every attempt number Slack names is one the ledger has, with the same outcome.
    by_number = {r[0]: r[1] for r in rows}
    for text in texts:
        for number in re.findall(r"#(\d+) mem_fraction_static=\S+(?: \(auto\))? "
                                 r"cuda_graph_max_bs=\S+(?: \(auto\))? → (\w+)", text):
            assert by_number[int(number[0])] == number[1], text


def ledger_row_ready(path: Path, attempt: int, timeout: float = 20.0) -> None:
    """Wait until the ledger file holds ``attempt``'s time to ready (SQLite has no change
    notification across processes, so this reads the file every 50 ms until ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        db = sqlite3.connect(path)
        try:
            row = db.execute("SELECT seconds_to_ready FROM attempts WHERE server = ? AND "
                             "attempt = ?", (SERVER, attempt)).fetchone()
        except sqlite3.OperationalError:  # the table is not there yet
            row = None
        finally:
            db.close()
        if row is not None and row[0] is not None:
            return
        assert time.monotonic() < deadline, f"attempt {attempt}: no ready row in the ledger"
        time.sleep(0.05)

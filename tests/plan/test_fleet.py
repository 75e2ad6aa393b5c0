"""Learning from the fleet end to end: `launcher up` on a simulated host files each attempt's
observed costs in the ledger under its key (architecture from config.json, GPU model from
nvidia-smi, SGLang version), and the next estimate starts from them. Also the nvidia-smi name
parsing (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from launcher.plan.fleet import parse_names
from launcher.store.ledger import Ledger, ledger_path
from tests.supervise import SimSetup, json_lines, run_cli

pytestmark = pytest.mark.timeout(180)  # two `up`s and two `down`s


def events(stdout: str) -> list[dict[str, Any]]:
    return [e for e in json_lines(stdout) if "event" in e]


def test_parse_names_reads_index_and_name_lines() -> None:
    # `nvidia-smi --query-gpu=index,name --format=csv,noheader` on an 8 x H100 host
    text = "0, NVIDIA H100 80GB HBM3\n1, NVIDIA H100 80GB HBM3\n\nnot a row\n"
    assert {0: "NVIDIA H100 80GB HBM3", 1: "NVIDIA H100 80GB HBM3"} == parse_names(text)


def test_up_records_observations_and_the_next_estimate_learns_from_them(sim: SimSetup) -> None:
    config = sim.write_toml(sim.data(cuda_graph_max_bs=8))  # the fraction from the estimate
    cold = json.loads(run_cli("plan", str(config), "--json").stdout)[0]
    assert cold["estimate"]["basis"].startswith("cold estimate"), cold["estimate"]
    first = run_cli("up", str(config), "--until-ready", "--log-format", "json")
    assert 0 == first.returncode, first.stderr + first.stdout
    run_cli("down", str(config))
    with Ledger(ledger_path(sim.state_dir)) as ledger:
        rows = ledger.observations()
        attempts = ledger.history()
    ready = [r for r in rows if r.outcome == "ready"]
    assert ready, [r.outcome for r in rows]
    row = ready[0]
    assert row.attempt_id in {a.id for a in attempts}
    # tiny-1b-sim's config.json, the sim's nvidia-smi name, the configured version
    assert ("LlamaForCausalLM", "NVIDIA H100 80GB HBM3", "0.5.23", "") == (
        row.key.architecture, row.key.gpu_model, row.key.sglang_version, row.key.speculative)
    obs = row.observed
    assert obs.weights_gib is not None and obs.weights_gib > 2.0  # tiny-1b-sim: 2.3 GiB
    assert obs.kv_tokens and obs.kv_pool_gib and obs.graph_mem_gib
    assert obs.ready_avail_gib is not None
    assert row.estimate is not None and row.estimate.graph_bs == 8

    # plan draws what the next `up --fresh` will act on: the ledger-corrected estimate, and
    # says so (above the bars, and under "estimate" in --json)
    planned = run_cli("plan", str(config), "--json", "--fresh")
    assert 0 == planned.returncode, planned.stderr
    est = json.loads(planned.stdout)[0]["estimate"]
    assert est["basis"].startswith("ledger-corrected estimate: corrected by"), est
    text = run_cli("plan", str(config), "--fresh").stdout
    assert "memory   ledger-corrected estimate: corrected by" in text

    again = run_cli("up", str(config), "--until-ready", "--log-format", "json", "--fresh")
    assert 0 == again.returncode, again.stderr + again.stdout
    run_cli("down", str(config))
    initial = next(e for e in events(again.stdout) if e["event"] == "params.initial")
    assert "corrected by" in initial["reason"], initial["reason"]
    # the fraction plan drew is the one up started with
    assert f"mem_fraction_static={est['mem_fraction_static']:.3f} " in initial["params"], (
        initial["params"], est)
    started = next(e for e in events(again.stdout) if e["event"] == "attempt.started")
    assert "corrected by" in json.dumps(started)

"""`launcher plan` on a LoRA server, end to end with the real CLI against the simulated host:
the adapters' configs are read on the host, the LoRA pool is in the estimate's JSON, its bar
and its text (docs/memory.md, "The LoRA pool")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.supervise import SimSetup, run_cli

pytestmark = pytest.mark.timeout(120)


def test_plan_shows_the_lora_pool_read_from_the_adapters(sim: SimSetup, tmp_path: Path) -> None:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps(
        {"r": 64, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}))
    config = sim.write_toml(sim.data(server={"extra_args": [
        "--lora-paths", f"a={adapter}", "--max-loras-per-batch", "2"]}))
    js = run_cli("plan", str(config), "--json")
    assert js.returncode == 0, js.stderr
    row = json.loads(js.stdout)[0]
    assert row["no_estimate"] is None
    est = row["estimate"]
    assert est["lora_gib"] > 0 and row["memory"][0]["lora_gib"] == est["lora_gib"]
    assert "2 adapters per batch x rank 64" in est["lora"]
    assert "adapter_config.json" in est["lora"]
    assert "LoRA pool" in row["first_attempt"]["reason"]
    text = run_cli("plan", str(config))
    assert text.returncode == 0, text.stderr
    assert "static budget (weights + LoRA pool + KV)" in text.stdout
    assert "rank 64" in text.stdout


def test_plan_with_an_unreadable_adapter_says_why_and_the_fix(
    sim: SimSetup, tmp_path: Path
) -> None:
    missing = tmp_path / "nowhere"
    config = sim.write_toml(sim.data(server={"extra_args": ["--lora-paths", str(missing)]}))
    js = run_cli("plan", str(config), "--json")
    assert js.returncode == 0, js.stderr
    why = json.loads(js.stdout)[0]["no_estimate"]
    assert f"{missing}/adapter_config.json" in why and "--max-lora-rank" in why

"""The LoRA pool in the memory estimate (launcher/memory/estimate.py): SGLang allocates it after
the weights and before it sizes the KV pool (0.5.23 model_executor/model_runner.py:715-733), so
it comes off the KV pool's rest, and the plan's bar and text show it. Pure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.memory.estimate import Estimate, choose, estimate
from launcher.params import LaunchParams
from launcher.sglang.lora import LoraShape, normalize_modules
from launcher.sglang.modelfacts import GIB, GpuFacts, ModelFacts, ServerShape, WeightFacts

CASE = (Path(__file__).resolve().parents[1] / "fixtures" / "real_startups"
        / "docs-llama31-8b-lora-h100-tp1-mf0874-bs4-20250827")
SEVEN = normalize_modules(("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                           "down_proj"))


def _estimate(lora: LoraShape | None) -> Estimate:
    model = ModelFacts.from_config(json.loads((CASE / "config.json").read_text()))
    return estimate(model, WeightFacts(16060522496), [GpuFacts(0, 79.65, 0.0, "H100")],
                    ServerShape(tp=1, sglang_version="0.5.23"), lora=lora)


def test_the_pool_comes_off_the_kv_pool_and_shows_in_the_bar() -> None:
    plain = _estimate(None)
    lora = _estimate(LoraShape(3, 256, SEVEN))
    assert lora.lora_gib == pytest.approx(3.75)
    a, b = plain.at(0.874, 4), lora.at(0.874, 4)
    assert a.kv_pool_gib - b.kv_pool_gib == pytest.approx(3.75)
    assert a.kv_tokens - b.kv_tokens == pytest.approx(3.75 * GIB / plain.cell_bytes, abs=1)
    assert b.lora_gib == pytest.approx(3.75) and a.lora_gib == 0
    bar = b.gpus[0]
    assert bar.lora_gib == pytest.approx(3.75) and bar.as_dict()["lora_gib"] == 3.75
    # the static budget is the same: the KV pool is smaller by the pool, free memory unchanged
    assert bar.free_gib == pytest.approx(a.gpus[0].free_gib)
    parts = (bar.weights_gib + bar.lora_gib + bar.kv_gib + bar.graphs_gib + bar.activations_gib
             + bar.other_gib + bar.context_gib + bar.free_gib)
    assert parts == pytest.approx(bar.total_gib)
    assert any("LoRA pool 3.75 GiB/GPU" in n for n in lora.notes)


def test_the_pool_raises_the_lowest_feasible_fraction_and_is_in_the_reason() -> None:
    plain, lora = _estimate(None), _estimate(LoraShape(3, 256, SEVEN))
    lo_a, _ = plain.feasible_range(4) or (0.0, 0.0)
    lo_b, _ = lora.feasible_range(4) or (0.0, 0.0)
    assert (lo_b - lo_a) * lora.pre_load_free_gib == pytest.approx(3.75)
    choice = choose(lora, LaunchParams())
    assert "LoRA pool 3.75 GiB (before the KV pool)" in choice.reason
    assert "LoRA" not in choose(plain, LaunchParams()).reason


def test_unknown_targets_take_the_upper_bound_and_say_so() -> None:
    e = _estimate(LoraShape(2, 256, None))
    assert e.lora_gib == pytest.approx(2.50)
    assert e.lora is not None and "upper bound" in e.lora.describe()

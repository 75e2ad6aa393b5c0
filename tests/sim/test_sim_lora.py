"""The simulated SGLang's LoRA pool (launcher/sim/model.py ``resolve_lora_shape``,
launcher/sim/memory.py ``simulate``): the sim reads the adapters' ``adapter_config.json`` like
SGLang, allocates the pool right after the target's weights and sizes the KV pool from what is
left, so a LoRA start-up's figures follow the real ones (docs/memory.md, "LoRA pool")."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from launcher.params import LaunchParams
from launcher.sglang.modelfacts import GIB
from launcher.sim.memory import simulate
from launcher.sim.model import ConfigFailure, scenario_from_argv
from tests.simhost import READY_LINE, free_port, make_sim_host

pytestmark = pytest.mark.timeout(120)

CASE = (Path(__file__).resolve().parents[1] / "fixtures" / "real_startups"
        / "docs-llama31-8b-lora-h100-tp1-mf0874-bs4-20250827")
SEVEN = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _llama(tmp_path: Path) -> Path:
    """Llama-3.1-8B's config.json (from the real start-up's case) as a sim model."""
    d = tmp_path / "llama31-8b"
    d.mkdir()
    cfg = json.loads((CASE / "config.json").read_text())
    cfg["sim"] = {"weights_gib": 14.96}
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _adapters(tmp_path: Path, *ranks: int) -> list[str]:
    out = []
    for i, r in enumerate(ranks):
        d = tmp_path / f"adapter{i}"
        d.mkdir()
        (d / "adapter_config.json").write_text(json.dumps(
            {"r": r, "lora_alpha": 16, "target_modules": SEVEN}))
        out.append(f"lora{i}={d}")
    return out


def _lora_args(tmp_path: Path, model: Path) -> list[str]:
    return ["--model-path", str(model), "--mem-fraction-static", "0.874",
            "--cuda-graph-max-bs", "4", "--lora-paths", *_adapters(tmp_path, 4, 256),
            "--max-loras-per-batch", "2"]


@pytest.mark.parametrize("version", ["0.5.10", "0.5.23"])
def test_the_pool_comes_off_the_kv_pool_as_in_the_worked_figures(
    tmp_path: Path, version: str
) -> None:
    """Rank 256 (the adapters' largest r), 2 per batch, all seven modules: 2 x 256 x 5,242,880 B
    = 2.50 GiB, between ``Load weight end`` and the KV pool (the real logs: 2.47)."""
    model = _llama(tmp_path)
    graph = "--cuda-graph-max-bs-decode" if version == "0.5.23" else "--cuda-graph-max-bs"
    argv = [graph if a == "--cuda-graph-max-bs" else a for a in _lora_args(tmp_path, model)]
    scen, params = scenario_from_argv(version, argv, 79.65)
    assert scen.lora_gib == pytest.approx(2.50)
    plain, _ = scenario_from_argv(version, argv[:6], 79.65)
    assert plain.lora_gib == 0
    t, p = simulate(scen, params), simulate(plain, params)
    assert t.ok and p.ok
    assert t.post_weights_free_gib == p.post_weights_free_gib
    gap = (t.post_weights_free_gib or 0) - (t.kv_pool_gib or 0) - (t.pool_end_free_gib or 0)
    assert gap == pytest.approx(2.50)
    assert (p.kv_pool_gib or 0) - (t.kv_pool_gib or 0) == pytest.approx(2.50)
    per_1k = scen.kv_gib_per_1k_tokens
    assert (p.kv_tokens or 0) - (t.kv_tokens or 0) == pytest.approx(2.50 / per_1k * 1000, abs=2)


def test_a_lora_startup_logs_the_figures_sglang_logs(tmp_path: Path) -> None:
    """A real sim process: ``Load weight end`` avail - K - V - ``Memory pool end`` avail is the
    LoRA pool (2.50 GiB; the non-LoRA gap of the real logs, 0.26 GiB, is not simulated)."""
    host = make_sim_host(tmp_path, gpu_count=1, gpu_total_gib=79.65)
    args = _lora_args(tmp_path, _llama(tmp_path))
    args[args.index("--cuda-graph-max-bs")] = "--cuda-graph-max-bs-decode"
    with host.start(*args, "--port", str(free_port())) as sim:
        sim.wait_for(READY_LINE, timeout=60)
    out = sim.output
    assert "Using csgmv as backend of LoRA kernels." in out
    end = float(re.findall(r"Load weight end\..*?avail mem=([\d.]+) GB", out)[0])
    k, v = (float(x) for x in re.findall(r"K size: ([\d.]+) GB, V size: ([\d.]+) GB", out)[0])
    pool_end = float(re.findall(r"Memory pool end\. avail mem=([\d.]+) GB", out)[0])
    assert end - k - v - pool_end == pytest.approx(2.50, abs=0.02)


def test_an_adapter_without_its_config_fails_the_start_up(tmp_path: Path) -> None:
    model = _llama(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigFailure, match=r"adapter_config\.json"):
        scenario_from_argv("0.5.23", ["--model-path", str(model), "--lora-paths", str(empty)],
                           79.65)
    # the shape flags alone, without adapters: SGLang's assertion
    with pytest.raises(ConfigFailure, match="need to specify both --max-lora-rank"):
        scenario_from_argv("0.5.23", ["--model-path", str(model), "--enable-lora"], 79.65)


def test_shape_flags_need_no_adapter_files(tmp_path: Path) -> None:
    model = _llama(tmp_path)
    scen, _ = scenario_from_argv(
        "0.5.23", ["--model-path", str(model), "--enable-lora", "--max-lora-rank", "256",
                   "--lora-target-modules", *SEVEN, "--max-loras-per-batch", "3"], 79.65)
    assert scen.lora_gib * GIB == pytest.approx(3 * 256 * 5_242_880)
    # LaunchParams are untouched by LoRA
    assert scenario_from_argv("0.5.23", ["--model-path", str(model)], 79.65)[1] == LaunchParams()

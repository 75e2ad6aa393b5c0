"""The simulator's hidden costs follow SGLang's formulas (figures worked by hand from SGLang's
source, as tests/test_budget.py does), for the shipped sim models. Pure: no processes."""

from __future__ import annotations

import pytest

from launcher.sglang.budget import GIB
from launcher.sim.memory import MemoryScenario
from launcher.sim.server import scenario_from_argv
from tests.simhost import model_dir


def scenario(name: str, tp: int, *extra: str, version: str = "0.5.23") -> MemoryScenario:
    argv = ["--model-path", str(model_dir(name)), "--tp", str(tp), *extra]
    return scenario_from_argv(version, argv, 94.97)[0]


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_gqa_kv_cell_is_kv_heads_over_tp_heads_in_gib(tp: int) -> None:
    """pool_configurator._compute_cell_size: max(1, 8 // tp) heads x (128 + 128) x 80 layers x
    2 bytes per token on one rank; GiB are 2**30 bytes (no MiB/GB mix-up)."""
    s = scenario("llama-70b-sim", tp)
    assert s.kv_gib_per_1k_tokens * GIB / 1000 == pytest.approx(max(1, 8 // tp) * 256 * 80 * 2)


@pytest.mark.parametrize("tp", [1, 4, 8])
def test_mla_kv_cell_is_not_sharded_by_tp(tp: int) -> None:
    """calculate_mla_kv_cache_dim: (kv_lora_rank 512 + qk_rope_head_dim 64) x 43 layers x 2
    bytes on every rank, whatever tp."""
    s = scenario("deepseek-v4-flash-sim", tp)
    assert s.kv_gib_per_1k_tokens * GIB / 1000 == pytest.approx((512 + 64) * 43 * 2)


def test_mtp_draft_cell_is_the_targets_per_layer() -> None:
    """0.5.23 pool_configurator: the draft's cell = the target's x 1 MTP layer / 43 layers."""
    s = scenario("deepseek-v4-flash-sim", 4, "--speculative-algorithm", "EAGLE")
    assert s.spec is not None
    per_token = s.spec.draft_kv_gib_per_1k_tokens * GIB / 1000
    assert per_token == int((512 + 64) * 43 * 2 / 43)


def test_hybrid_state_per_slot_is_mamba2_state_shape() -> None:
    """Mamba2StateShape.create (Qwen3-Next GDN): conv_dim = 48 x 128 + 2 x 16 x 128 = 10240,
    conv (10240, 3) bf16, temporal (48, 128, 128) fp32, 48 linear layers: 153,944,064 bytes."""
    s = scenario("qwen3.6-27b-sim", 1)
    assert s.hybrid is not None
    assert s.hybrid.conv_gib_per_req * GIB == pytest.approx(10240 * 3 * 2 * 48)
    assert s.hybrid.ssm_gib_per_req * GIB == pytest.approx(48 * 128 * 128 * 4 * 48)
    assert s.hybrid.per_req_gib * GIB == pytest.approx(153_944_064)


def test_mla_projections_and_router_are_replicated_on_every_rank() -> None:
    """deepseek_v2.py: fused_qkv_a_proj_with_mqa (hidden x (q_lora + kv_lora + rope)) and the
    MoE gate are ReplicatedLinear; each rank holds them whole, 1/tp of the rest."""
    s = scenario("kimi-k2.5-sim", 8)
    rep = (61 * 7168 * (1536 + 512 + 64) * 2 + 60 * 7168 * 384 * 2) / GIB
    assert s.replicated_gib == pytest.approx(rep)
    assert s.weights_per_rank_gib == pytest.approx((s.weights_gib - rep) / 8 + rep)
    assert s.weights_per_rank_gib == pytest.approx(72.33, abs=0.01)  # the seeds' figure

"""SGLang's LoRA memory pool (launcher/sglang/lora.py): pure arithmetic against the worked
figures of the real LoRA start-ups (docs/memory.md, "LoRA pool"), the flag forms SGLang takes,
and the shape resolved from the adapters' configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.sglang.lora import (
    LoraAdapter,
    LoraFlags,
    LoraShape,
    adapter_shape,
    linear_modules,
    lora_pool,
    normalize_modules,
    parse_lora_flags,
    resolve_lora,
)
from launcher.sglang.modelfacts import GIB, ModelFacts, NoEstimate

CASES = Path(__file__).resolve().parents[1] / "fixtures" / "real_startups"
LLAMA_CASE = "docs-llama31-8b-lora-h100-tp1-mf0874-bs4-20250827"
SEVEN = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Llama-3.1-8B (hidden 4096, kv dim 1024, intermediate 14336, 32 layers, bf16), all seven
# linear modules, one adapter slot, rank 1: 32 x 2 B x [A: 3*4096 + 4096 + 2*4096 + 14336;
# B: (4096 + 2*1024) + 4096 + 2*14336 + 4096]
PER_SLOT_RANK = 32 * 2 * ((3 * 4096 + 4096 + 2 * 4096 + 14336)
                          + ((4096 + 2 * 1024) + 4096 + 2 * 14336 + 4096))


@pytest.fixture(scope="module")
def llama() -> ModelFacts:
    return ModelFacts.from_config(json.loads((CASES / LLAMA_CASE / "config.json").read_text()))


def _shape(n: int, rank: int, targets: tuple[str, ...] | None = SEVEN) -> LoraShape:
    return LoraShape(n, rank, None if targets is None else normalize_modules(targets))


def test_worked_figure_per_adapter_slot_and_unit_rank(llama: ModelFacts) -> None:
    assert PER_SLOT_RANK == 5_242_880
    for version in ("0.5.10", "0.5.23"):
        assert lora_pool(llama, _shape(1, 1), 1, version).total_bytes == PER_SLOT_RANK


def test_the_real_startups_pools(llama: ModelFacts) -> None:
    """docs-...-fa3-mf0841-bs4-2026*: rank 256, 2 per batch -> 2.50 GiB (the logs: 2.47);
    -20250827: rank 256, 3 per batch -> 3.75 GiB (the log: 3.88)."""
    assert lora_pool(llama, _shape(2, 256), 1, "0.5.23").gib == pytest.approx(2.50)
    assert lora_pool(llama, _shape(3, 256), 1, "0.5.10").gib == pytest.approx(3.75)
    assert 2 * 256 * PER_SLOT_RANK == int(2.5 * GIB)


def test_unknown_targets_are_every_linear_module_and_said_so(llama: ModelFacts) -> None:
    bound = lora_pool(llama, _shape(2, 256, None), 1, "0.5.23")
    assert bound.upper_bound and bound.total_bytes == 2 * 256 * PER_SLOT_RANK
    assert "upper bound" in bound.describe()
    assert linear_modules(llama) == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}
    exact = lora_pool(llama, _shape(2, 256, ("q_proj", "v_proj")), 1, "0.5.23")
    assert not exact.upper_bound and "upper bound" not in exact.describe()
    # q and v share qkv_proj's stacked buffer: A 3r x 4096, B 6144 x r per layer
    assert exact.total_bytes == 2 * 256 * 32 * 2 * (3 * 4096 + 6144)


def test_tp_splits_row_parallel_inputs_and_column_parallel_outputs(llama: ModelFacts) -> None:
    # tp 2: qkv B 6144/2, o A 4096/2, gate_up B 28672/2, down A 14336/2; the rest whole
    per = 32 * 2 * ((3 * 4096 + 2048 + 2 * 4096 + 7168) + (3072 + 4096 + 14336 + 4096))
    assert lora_pool(llama, _shape(1, 1), 2, "0.5.23").total_bytes == per


def test_qkv_keeps_whole_kv_heads_beyond_tp_8_from_0_5_23(llama: ModelFacts) -> None:
    """tp 16 > 8 KV heads: 0.5.23 keeps one K and one V head per rank in qkv's B
    (4096/16 + 2 x 128); 0.5.10 divides the whole output by tp (6144/16)."""
    qkv = _shape(1, 1, ("q_proj",))
    a = 32 * 2 * 3 * 4096
    assert lora_pool(llama, qkv, 16, "0.5.23").total_bytes == a + 32 * 2 * (256 + 256)
    assert lora_pool(llama, qkv, 16, "0.5.10").total_bytes == a + 32 * 2 * 384


def test_all_adds_the_embeddings(llama: ModelFacts) -> None:
    flags = LoraFlags((), 1, 1, ("all",))
    for version in ("0.5.10", "0.5.23"):
        shape = resolve_lora(flags, None, llama, version)
        assert shape.target_modules == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj",
                                        "embed_tokens", "lm_head"}
        embeddings = 2 * 2 * (llama.vocab_size + llama.hidden_size)
        assert lora_pool(llama, shape, 1, version).total_bytes == PER_SLOT_RANK + embeddings


def test_moe_experts_get_four_dimensional_buffers() -> None:
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "intermediate_size": 256, "moe_intermediate_size": 32, "num_experts": 8,
           "num_experts_per_tok": 2, "vocab_size": 100, "torch_dtype": "bfloat16"}
    model = ModelFacts.from_config(cfg)
    pool = lora_pool(model, _shape(2, 4, ("gate_proj", "down_proj")), 2, "0.5.23")
    shapes = {b.module: (b.a_shape, b.b_shape, b.count) for b in pool.buffers}
    assert shapes == {
        "gate_up_proj_moe": ((2, 8, 8, 64), (2, 8, 32, 4), 2),  # 2 x 32 / tp 2
        "down_proj_moe": ((2, 8, 4, 16), (2, 8, 64, 4), 2),  # input 32 / tp 2
    }
    assert any("MoE" in n for n in pool.notes)
    # a shared expert adds the 3-D buffers beside the experts'
    shared = ModelFacts.from_config({**cfg, "shared_expert_intermediate_size": 128})
    names = {b.module for b in lora_pool(shared, _shape(2, 4, ("down_proj",)), 1,
                                         "0.5.23").buffers}
    assert names == {"down_proj", "down_proj_moe"}


def test_a_shared_experts_width_is_its_own_from_0_5_23() -> None:
    """Qwen2-57B-A14B's geometry (intermediate 18944, shared expert 20480): 0.5.23 reads the
    shared expert's own linear, 0.5.10 the config's intermediate size."""
    cfg = {"architectures": ["Qwen2MoeForCausalLM"], "num_hidden_layers": 1,
           "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
           "intermediate_size": 18944, "moe_intermediate_size": 2560, "num_experts": 64,
           "num_experts_per_tok": 8, "shared_expert_intermediate_size": 20480,
           "vocab_size": 151936, "torch_dtype": "bfloat16"}
    model = ModelFacts.from_config(cfg)

    def gate_up_b(version: str) -> tuple[int, ...]:
        pool = lora_pool(model, _shape(1, 8, ("gate_proj",)), 1, version)
        return next(b.b_shape for b in pool.buffers if b.module == "gate_up_proj")

    assert gate_up_b("0.5.23") == (1, 2 * 20480, 8)
    assert gate_up_b("0.5.10") == (1, 2 * 18944, 8)


def test_a_module_without_a_rule_is_named_not_guessed(llama: ModelFacts) -> None:
    pool = lora_pool(llama, _shape(1, 1, ("in_proj", "o_proj")), 1, "0.5.23")
    assert {b.module for b in pool.buffers} == {"o_proj"}
    assert "in_proj" in pool.describe()


# --- the flags -----------------------------------------------------------------------------


def test_planted_flags_in_every_form_sglang_takes() -> None:
    argv = ["--context-length", "8192",
            "--lora-paths", "lora0=/a/b", "/c", ' {"lora_name": "x", "lora_path": "/d",'
            ' "pinned": true} ',
            "--max-loras-per-batch=3", "--max-lora-rank", "64",
            "--lora-target-modules", "q_proj", "v_proj", "--enable-metrics"]
    flags = parse_lora_flags(argv)
    assert flags == LoraFlags(
        (LoraAdapter("lora0", "/a/b"), LoraAdapter("/c", "/c"), LoraAdapter("x", "/d")),
        3, 64, ("q_proj", "v_proj"))
    assert not flags.needs_adapter_configs
    # the last --lora-paths wins (argparse), --opt=value, --enable-lora alone
    again = parse_lora_flags(["--lora-paths", "/x", "--lora-paths=n=/y"])
    assert again is not None and again.adapters == (LoraAdapter("n", "/y"),)
    assert again.max_loras_per_batch == 8 and again.needs_adapter_configs
    assert parse_lora_flags(["--enable-lora", "--max-lora-rank", "8",
                             "--lora-target-modules", "all"]) == LoraFlags((), 8, 8, ("all",))
    assert parse_lora_flags(["--context-length", "8192"]) is None


def test_abbreviated_flags_count_as_argparse_counts_them() -> None:
    """SGLang's argparse takes an unambiguous prefix; an ambiguous one is left unread."""
    flags = parse_lora_flags(["--lora-path", "a=/x", "--max-lora-r", "64", "--max-loras=2",
                              "--lora-target", "q_proj"])
    assert flags == LoraFlags((LoraAdapter("a", "/x"),), 2, 64, ("q_proj",))
    assert parse_lora_flags(["--max-lora", "8"]) is None  # rank or per-batch: ambiguous


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["--enable-lora"], "needs both --max-lora-rank and --lora-target-modules"),
        (["--lora-paths", "/a", "--max-lora-rank", "big"], "--max-lora-rank 'big'"),
        (["--lora-paths", "/a", "--max-loras-per-batch", "0"], "must be positive"),
        (["--lora-paths", "{nope}"], "not a JSON object"),
        (["--lora-paths", "/a", "--lora-target-modules", "all", "q_proj"], "only module"),
        (["--lora-paths", "/a", "--lora-target-modules", "--max-lora-rank", "8"], "no module"),
        (["--enable-lora", "--max-lora-rank", "0", "--lora-target-modules", "q_proj"],
         "rank above 0"),
    ],
)
def test_flags_sglang_refuses_give_no_estimate(argv: list[str], why: str) -> None:
    with pytest.raises(NoEstimate, match=why):
        parse_lora_flags(argv)


# --- the adapters' configs -----------------------------------------------------------------


def test_adapter_configs_give_rank_and_normalized_targets() -> None:
    assert adapter_shape({"r": 16, "target_modules": ["model.layers.q_proj", "k_proj",
                                                      "up_proj"]}, "/a") == (
        16, frozenset({"qkv_proj", "gate_up_proj"}))
    assert adapter_shape({"r": 8, "target_modules": "all-linear"}, "/a") == (8, "all")
    for bad, why in (({"target_modules": ["q_proj"]}, "no rank"),
                     ({"r": 8, "target_modules": ".*proj"}, "pattern"),
                     ({"r": 8}, "no list of target_modules"), ([], "not a JSON object")):
        with pytest.raises(NoEstimate, match=why) as exc:
            adapter_shape(bad, "/a")  # type: ignore[arg-type]
        assert "/a/adapter_config.json" in str(exc.value) and "--max-lora-rank" in str(exc.value)


def test_shape_from_the_adapters_is_the_union_and_the_largest_rank(llama: ModelFacts) -> None:
    flags = LoraFlags((LoraAdapter("a", "/a"), LoraAdapter("b", "/b")), 2)
    configs = [(4, frozenset({"qkv_proj"})), (64, frozenset({"o_proj", "down_proj"}))]
    shape = resolve_lora(flags, configs, llama, "0.5.23")
    assert (shape.max_lora_rank, shape.target_modules) == (
        64, {"qkv_proj", "o_proj", "down_proj"})
    assert "adapter_config.json" in shape.source
    # "all-linear" resolves on the model: its linear modules and the embeddings
    everything = resolve_lora(flags, [(8, "all")], llama, "0.5.23")
    assert everything.target_modules == linear_modules(llama) | {"embed_tokens", "lm_head"}
    # unread configs: the rank must come from the flags
    with pytest.raises(NoEstimate, match="--max-lora-rank"):
        resolve_lora(flags, None, llama, "0.5.23")
    # an adapter beyond --lora-target-modules: SGLang refuses to start
    narrow = LoraFlags(flags.adapters, 2, None, ("o_proj",))
    with pytest.raises(NoEstimate, match="beyond --lora-target-modules"):
        resolve_lora(narrow, configs, llama, "0.5.23")

"""Every real start-up case (tests/fixtures/real_startups/) follows the schema.

A malformed case fails here, not in the benchmark that reads it: the loader checks keys, units,
the id against the directory and the figures against each other, and each figure must be a number
the log really prints (figures are read off the log, never computed).
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from tests.real_startups import (
    ROOT,
    CaseError,
    case_dirs,
    figures_not_in_log,
    load_case,
    load_cases,
    log_numbers,
)

CASES = case_dirs()


def test_the_corpus_is_there() -> None:
    assert CASES, "tests/fixtures/real_startups/ lost its cases"


@pytest.mark.parametrize("directory", CASES, ids=[d.name for d in CASES])
def test_case_loads_and_its_figures_are_printed_in_its_log(directory: Path) -> None:
    case = load_case(directory)
    assert figures_not_in_log(case) == []


def test_ids_are_unique_and_sources_are_public() -> None:
    cases = load_cases()
    assert len({c.id for c in cases}) == len(cases)
    assert all(c.source_url.startswith("https://") for c in cases)


def test_log_numbers_compare_by_value() -> None:
    numbers = log_numbers("[2025-03-08 12:29:21 TP0] Memory pool end. avail mem=12.00 GB\n")
    assert Decimal("2025") in numbers
    assert Decimal("12.0") in numbers  # printed as 12.00
    assert Decimal("0") not in numbers  # "TP0" is a rank, not a printed figure


SYNTHETIC_LOG = """\
[2025-03-08 12:29:13 TP0] Load weight begin. avail mem=21.63 GB
[2025-03-08 12:29:21 TP0] Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16, avail mem=6.09 GB, mem usage=15.54 GB.
[2025-03-08 12:29:21 TP0] KV Cache is allocated. #tokens: 46611, K size: 1.42 GB, V size: 1.42 GB
[2025-03-08 12:29:21 TP0] Memory pool end. avail mem=2.09 GB
"""  # noqa: E501 (log lines are whole)

SYNTHETIC_TOML = """\
id = "gh1-synthetic"
source_url = "https://github.com/sgl-project/sglang/issues/1"
source_kind = "github-issue"
retrieved = "2026-12-05"
config_url = "https://example.org/config.json"
draft_config_url = ""
weights_total_bytes = 0
weights_index_url = ""
model = "Qwen/QwQ-32B"
draft_model = ""
sglang_version = "0.4.3.post2"
sglang_version_basis = "stated: test"
gpu = "NVIDIA L4"
gpu_total_gib = 22.06
gpu_basis = "inferred: test"
tp = 4
dp = 1
ep = 1
pp = 1
nnodes = 1
kinds = ["dense"]
dtype = "bfloat16"
quantization = ""
attention_backend = ""
note = "synthetic"
html_unescaped = false

[flags]
mem_fraction_static = 0.85
cuda_graph_max_bs = 80
chunked_prefill_size = 2048
max_running_requests = 0
context_length = 0
speculative_algorithm = ""
speculative_num_steps = 0
speculative_eagle_topk = 0
speculative_num_draft_tokens = 0
disable_cuda_graph = false

[figures]
load_weight_begin_avail_gb = 21.63
load_weight_end_avail_gb = 6.09
weight_mem_usage_gb = 15.54
kv_tokens = 46611
k_size_gb = 1.42
v_size_gb = 1.42
memory_pool_end_avail_gb = 2.09
"""


@pytest.fixture
def good_case(tmp_path: Path) -> Path:
    """A small well-formed case, written here so the negative tests do not depend on the corpus."""
    case_dir = tmp_path / "gh1-synthetic"
    case_dir.mkdir()
    (case_dir / "log.txt").write_text(SYNTHETIC_LOG, encoding="utf-8")
    (case_dir / "case.toml").write_text(SYNTHETIC_TOML, encoding="utf-8")
    (case_dir / "config.json").write_text('{"model_type": "qwen2"}\n', encoding="utf-8")
    return case_dir


def test_the_synthetic_case_is_well_formed(good_case: Path) -> None:
    case = load_case(good_case)
    assert case.tp == 4 and case.figures["kv_tokens"] == 46611
    assert figures_not_in_log(case) == []


def _edit(case_dir: Path, old: str, new: str) -> None:
    path = case_dir / "case.toml"
    text = path.read_text(encoding="utf-8")
    assert old in text, old
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def test_a_case_whose_id_differs_from_its_directory_is_rejected(good_case: Path) -> None:
    _edit(good_case, 'id = "gh1-synthetic"', 'id = "gh1-other"')
    with pytest.raises(CaseError, match="differs from the directory name"):
        load_case(good_case)


def test_a_figure_without_a_unit_is_rejected(good_case: Path) -> None:
    _edit(good_case, "[figures]\n", "[figures]\nweights = 1.0\n")
    with pytest.raises(CaseError, match="end the name with its unit"):
        load_case(good_case)


def test_a_misread_weight_figure_is_rejected(good_case: Path) -> None:
    _edit(good_case, "weight_mem_usage_gb = 15.54", "weight_mem_usage_gb = 16.54")
    with pytest.raises(CaseError, match="misread"):
        load_case(good_case)


def test_a_figure_the_log_does_not_print_is_reported(good_case: Path) -> None:
    _edit(good_case, "memory_pool_end_avail_gb = 2.09", "memory_pool_end_avail_gb = 2.1")
    assert figures_not_in_log(load_case(good_case)) == ["memory_pool_end_avail_gb = 2.1"]


def test_kv_tokens_without_their_size_are_rejected(good_case: Path) -> None:
    _edit(good_case, "k_size_gb = 1.42\n", "")
    with pytest.raises(CaseError, match="without its size"):
        load_case(good_case)


def test_a_config_that_is_not_json_is_rejected(good_case: Path) -> None:
    (good_case / "config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(CaseError, match="does not parse as JSON"):
        load_case(good_case)


def test_held_out_is_not_decided_by_a_case(good_case: Path) -> None:
    _edit(good_case, "[flags]\n", "held_out = true\n\n[flags]\n")
    with pytest.raises(CaseError, match="held_out"):
        load_case(good_case)


def test_the_root_is_the_fixture_folder() -> None:
    assert ROOT.name == "real_startups" and ROOT.parent.name == "fixtures"


OLD_LOG = """\
[2024-12-03 20:04:35 TP0] Load weight begin. avail mem=78.59 GB
[2024-12-03 20:04:39 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=63.50 GB
[2024-12-03 20:04:39 TP0] Memory pool end. avail mem=8.37 GB
[2024-12-03 20:04:51 TP0] max_total_num_tokens=442913, max_prefill_tokens=16384, max_running_requests=2049, context_len=131072
"""  # noqa: E501 (log lines are whole)


def _as_old_log(case_dir: Path) -> None:
    """Turn the synthetic case into a SGLang 0.4.0 start-up: no KV line, max_total only."""
    (case_dir / "log.txt").write_text(OLD_LOG, encoding="utf-8")
    path = case_dir / "case.toml"
    text = path.read_text(encoding="utf-8")
    head = text[: text.index("[figures]\n")]
    path.write_text(
        head + "[figures]\nload_weight_begin_avail_gb = 78.59\nload_weight_end_avail_gb = 63.5\n"
        "memory_pool_end_avail_gb = 8.37\nmax_total_num_tokens = 442913\n",
        encoding="utf-8",
    )


def test_an_old_log_without_a_kv_line_loads_by_its_max_total(good_case: Path) -> None:
    _as_old_log(good_case)
    case = load_case(good_case)
    assert case.kv_pool_tokens == 442913
    assert figures_not_in_log(case) == []


def test_a_log_that_never_reaches_the_kv_pool_is_rejected(good_case: Path) -> None:
    _as_old_log(good_case)
    log = good_case / "log.txt"
    log.write_text("".join(OLD_LOG.splitlines(keepends=True)[:3]), encoding="utf-8")
    with pytest.raises(CaseError, match="reach the KV pool"):
        load_case(good_case)


def test_kv_sizes_without_tokens_load_when_max_total_is_given(good_case: Path) -> None:
    """SGLang 0.4.1.post7-0.4.3.post2 print 'K size: .. GB, V size: .. GB.' without #tokens."""
    _edit(good_case, "kv_tokens = 46611\n", "")
    with pytest.raises(CaseError, match="neither kv_tokens nor max_total_num_tokens"):
        load_case(good_case)
    _edit(
        good_case,
        "memory_pool_end_avail_gb",
        "max_total_num_tokens = 46611\nmemory_pool_end_avail_gb",
    )
    assert load_case(good_case).kv_pool_tokens == 46611


def test_a_negative_graph_mem_usage_is_kept_as_printed(good_case: Path) -> None:
    """SGLang's 'mem usage' is a difference of two free-memory readings: it can be negative."""
    log = good_case / "log.txt"
    log.write_text(
        SYNTHETIC_LOG
        + "[2025-08-11 21:42:34] Capture draft cuda graph end. Time elapsed: 6.22 s. "
        "mem usage=-0.14 GB. avail mem=58.20 GB.\n",
        encoding="utf-8",
    )
    passes = (
        '\n[[figures.graph_passes]]\npass = "draft"\nbegin_avail_gb = 58.05\n'
        "end_avail_gb = 58.2\nmem_usage_gb = -0.14\ntime_s = 6.22\n"
    )
    (good_case / "case.toml").write_text(
        (good_case / "case.toml").read_text(encoding="utf-8") + passes, encoding="utf-8"
    )
    case = load_case(good_case)
    assert case.graph_passes[0].mem_usage_gb == -0.14
    # 58.05 is not printed in this log; every other pass figure is, the negative one included.
    assert figures_not_in_log(case) == ["graph_passes[0].begin_avail_gb = 58.05"]
    _edit(good_case, "end_avail_gb = 58.2", "end_avail_gb = -58.2")
    with pytest.raises(CaseError, match="only mem_usage_gb"):
        load_case(good_case)


def test_a_draft_config_needs_its_exactness_stated(good_case: Path) -> None:
    (good_case / "draft_config.json").write_text('{"model_type": "llama"}\n', encoding="utf-8")
    _edit(
        good_case,
        'draft_config_url = ""',
        'draft_config_url = "https://example.org/draft_config.json"',
    )
    with pytest.raises(CaseError, match="draft_config_exact"):
        load_case(good_case)
    _edit(good_case, "weights_total_bytes", "draft_config_exact = false\nweights_total_bytes")
    assert load_case(good_case).draft_config_exact is False


def test_cases_without_a_draft_count_as_exact(good_case: Path) -> None:
    assert load_case(good_case).draft_config_exact is True
    _edit(good_case, "weights_total_bytes", "draft_config_exact = false\nweights_total_bytes")
    with pytest.raises(CaseError, match=r"without a draft_config\.json"):
        load_case(good_case)


# Line shapes SGLang prints for the model families the corpus still lacks (MoE/MLA and hybrid
# start-ups). The cases are synthetic; the shapes follow SGLang's own format
# strings: MLA pools print one latent "KV size" (python/sglang/srt/mem_cache/memory_pool.py,
# MLATokenToKVPool), hybrid GDN/Mamba models print a state-pool line before the KV line, and
# sliding-window models print both pool sizes (the hybrid log below carries both shapes for
# brevity; no single real model prints both). Recording them needs no loader change: the keys
# below follow the unit rules, and these tests keep it that way.
MLA_LOG = """\
[2025-06-02 10:00:00 TP0] Load weight begin. avail mem=139.12 GB
[2025-06-02 10:01:40 TP0] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail mem=54.31 GB, mem usage=84.81 GB.
[2025-06-02 10:01:41 TP0] KV Cache is allocated. #tokens: 1015808, KV size: 66.47 GB
[2025-06-02 10:01:41 TP0] Memory pool end. avail mem=10.52 GB
"""  # noqa: E501 (log lines are whole)

HYBRID_LOG = """\
[2026-02-27 17:10:27 TP0] Load weight begin. avail mem=22.84 GB
[2026-02-27 17:10:27 TP0] Load weight end. elapsed=653.47 s, type=Qwen3_5MoeForConditionalGeneration, dtype=torch.bfloat16, avail mem=19.08 GB, mem usage=3.76 GB.
[2026-02-27 17:10:28 TP0] Mamba Cache is allocated. max_mamba_cache_size: 82, conv_state size: 0.13GB, ssm_state size: 7.29GB 
[2026-02-27 17:10:28 TP0] Use sliding window memory pool. full_layer_tokens=580364, swa_layer_tokens=464291
[2026-02-27 17:10:28 TP0] KV Cache is allocated. #tokens: 580364, K size: 4.15 GB, V size: 4.15 GB
[2026-02-27 17:10:28 TP0] Memory pool end. avail mem=4.02 GB
"""  # noqa: E501, W291 (log lines are whole, trailing space included)


def _with_log(case_dir: Path, log: str, figures: str, kinds: str) -> None:
    (case_dir / "log.txt").write_text(log, encoding="utf-8")
    text = (case_dir / "case.toml").read_text(encoding="utf-8")
    head = text.split("[figures]\n", 1)[0].replace('kinds = ["dense"]', f"kinds = {kinds}")
    (case_dir / "case.toml").write_text(head + "[figures]\n" + figures, encoding="utf-8")


def test_an_mla_pool_loads_by_its_single_kv_size(good_case: Path) -> None:
    _with_log(
        good_case,
        MLA_LOG,
        "load_weight_begin_avail_gb = 139.12\nload_weight_end_avail_gb = 54.31\n"
        "weight_mem_usage_gb = 84.81\nkv_tokens = 1015808\nkv_size_gb = 66.47\n"
        "memory_pool_end_avail_gb = 10.52\n",
        '["moe", "mla", "quantized"]',
    )
    case = load_case(good_case)
    assert case.kv_pool_tokens == 1015808
    assert "k_size_gb" not in case.figures and case.figures["kv_size_gb"] == 66.47
    assert figures_not_in_log(case) == []


def test_a_hybrid_state_pool_and_swa_pool_load_as_printed(good_case: Path) -> None:
    """'0.13GB' (no space) must still count as printed; the state-pool keys need no new rule."""
    _with_log(
        good_case,
        HYBRID_LOG,
        "load_weight_begin_avail_gb = 22.84\nload_weight_end_avail_gb = 19.08\n"
        "weight_mem_usage_gb = 3.76\nmax_mamba_cache_size = 82\n"
        "mamba_conv_state_gb = 0.13\nmamba_ssm_state_gb = 7.29\n"
        "full_layer_tokens = 580364\nswa_layer_tokens = 464291\n"
        "kv_tokens = 580364\nk_size_gb = 4.15\nv_size_gb = 4.15\n"
        "memory_pool_end_avail_gb = 4.02\n",
        '["moe", "hybrid", "multimodal"]',
    )
    case = load_case(good_case)
    assert case.figures["mamba_ssm_state_gb"] == 7.29
    assert figures_not_in_log(case) == []
    _edit(good_case, "mamba_ssm_state_gb = 7.29", "mamba_ssm_state = 7.29")
    with pytest.raises(CaseError, match="mamba_ssm_state"):
        load_case(good_case)

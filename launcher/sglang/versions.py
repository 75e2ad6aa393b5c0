"""SGLang versions: parsing, the versions launcher knows, the default, and the named
versions from which one SGLang behaviour changes (see docs/sglang.md).

A threshold is a version tuple; ``at_least(version, THRESHOLD)`` is the one comparison.
Pure: no I/O.
"""

from __future__ import annotations

from launcher.untrusted import bounded_int

__all__ = [
    "AUTO_TABLE_2_FROM",
    "DECODE_SPELLING_FROM",
    "DEFAULT_VERSION",
    "DRAFT_EXTEND_FULL_WIDTH_FROM",
    "DRAFT_EXTEND_SWITCH_FROM",
    "DRAFT_KV_INDICES_TOPK_FROM",
    "FA3_ANY_MHA_FROM",
    "GATED_LAUNCH_FROM",
    "LORA_MODEL_AWARE_FROM",
    "MAMBA_RADIX_SPELLING_FROM",
    "ONE_STATIC_BUDGET_FROM",
    "SPEC_V2_ENV_REMOVED_FROM",
    "STATED_MINIMUM_FROM",
    "SUPPORTED_VERSIONS",
    "Version",
    "at_least",
    "version_tuple",
]

Version = tuple[int, ...]

# Assumed wherever a version is not configured, detected or shown by a log: the newest known.
DEFAULT_VERSION = "0.5.23"
# The versions the simulator emulates, oldest first (the contract tests check 0.5.10 and 0.5.23
# against SGLang's own argparse); another 0.5.x version is read by the rules of its range.
SUPPORTED_VERSIONS = ("0.5.6", "0.5.10", "0.5.15", DEFAULT_VERSION)

# --cuda-graph-max-bs is spelled --cuda-graph-max-bs-decode. 0.5.15 still accepts the old
# spelling as a deprecated alias; 0.5.23 rejects it as an ambiguous prefix.
DECODE_SPELLING_FROM: Version = (0, 5, 15)
# --mamba-scheduler-strategy is spelled --mamba-radix-cache-strategy (with the new choice
# extra_buffer_lazy). 0.5.15 still accepts the old spelling; 0.5.23 rejects it (exit 2).
MAMBA_RADIX_SPELLING_FROM: Version = (0, 5, 15)
# server_args' second auto table: bigger chunked-prefill and graph bs on 20-35 GiB GPUs, and
# the auto --mem-fraction-static reserves memory for prefill CUDA graphs.
AUTO_TABLE_2_FROM: Version = (0, 5, 15)
# SGLANG_ENABLE_SPEC_V2 was retired (PR #27964): 0.5.23 ignores it.
SPEC_V2_ENV_REMOVED_FROM: Version = (0, 5, 23)
# SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH exists (environ.py); 0.5.10 lacks it.
DRAFT_EXTEND_SWITCH_FROM: Version = (0, 5, 23)
# The draft-extend CUDA graph runs the whole draft tree per request,
# --speculative-num-draft-tokens (spec_utils.resolve_num_tokens_per_req); 0.5.10 runs
# steps + 1 (eagle_draft_extend_cuda_graph_runner.py:92, num_tokens_per_bs).
DRAFT_EXTEND_FULL_WIDTH_FROM: Version = (0, 5, 23)
# FlashInfer's multi-step draft backend sizes each draft-decode step's graph kv_indices row
# ``max_bs x topk x context`` (flashinfer_backend.py:2630-2646,
# spec_utils.draft_kv_indices_buffer_width); 0.5.10 sizes it ``max_bs x context``
# (flashinfer_backend.py:1627-1632), without topk.
DRAFT_KV_INDICES_TOPK_FROM: Version = (0, 5, 23)
# --gated-launch-port (arg_groups/fields/parallel.py, distributed/gated_launch.py); 0.5.10 lacks it.
GATED_LAUNCH_FROM: Version = (0, 5, 23)
# One static budget: the draft's weights load right after the target's and count in
# --mem-fraction-static (kv_cache_configurator.py); graphs are captured in passes, target
# prefill first; the auto fraction no longer reserves extra memory for speculative decoding.
ONE_STATIC_BUDGET_FROM: Version = (0, 5, 23)
# The default attention backend for an MHA model on Hopper is FA3 whatever the architecture,
# and trtllm_mha on SM100 (0.5.10 server_args.py:2217-2275 ``_get_default_attn_backend``;
# 0.5.23 arg_groups/model_override_base.py:277-350 ``get_default_attn_backend``). 0.5.6 gives
# FA3 only to the architectures of utils/common.py:2758-2775 ``is_fa3_default_architecture``
# (server_args.py:1294-1302) and FlashInfer on SM100; the release in between that changed it
# is not pinned, so 0.5.7-0.5.9 are read as 0.5.10.
FA3_ANY_MHA_FROM: Version = (0, 5, 7)
# The LoRA memory pool follows the model: --lora-target-modules all is resolved by inspecting
# the loaded model and adds embed_tokens/lm_head (0.5.23 lora/lora_manager.py:807-815; 0.5.10
# server_args.py:6318-6324 expands it to utils/common.py:3294's SUPPORTED_LORA_TARGET_MODULES);
# qkv_proj's B keeps whole KV heads when tp > kv heads (0.5.23 lora/mem_pool.py:492-525; 0.5.10
# mem_pool.py:243 divides by tp); a shared expert's gate_up/down width is moe_intermediate x
# n_shared_experts on its MoE layers (0.5.23 lora/utils.py:201-220; 0.5.10 utils.py:90-93 takes
# intermediate_size). The release in between is not pinned: 0.5.11-0.5.22 are read as 0.5.10.
LORA_MODEL_AWARE_FROM: Version = (0, 5, 23)
# A KV pool <= 0 error states the minimum viable fraction ("minimum viable = ...").
STATED_MINIMUM_FROM: Version = (0, 5, 23)


MAX_COMPONENT_DIGITS = 9  # of one dotted component of a version ("0.5.23": 1, 1, 2)


def version_tuple(version: str) -> Version:
    """'0.5.23' -> (0, 5, 23); '0.5.6.post2' -> (0, 5, 6); stops at the first non-number,
    or at a component of more than MAX_COMPONENT_DIGITS digits (the host's text)."""
    parts: list[int] = []
    for piece in version.split("."):
        number = bounded_int(piece, max_digits=MAX_COMPONENT_DIGITS)
        if number is None:
            break
        parts.append(number)
    return tuple(parts)


def at_least(version: str, threshold: Version) -> bool:
    """True when ``version`` is ``threshold`` or newer."""
    return version_tuple(version) >= threshold

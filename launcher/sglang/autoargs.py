"""SGLang's auto values: what a server runs with when launcher leaves a flag unset.

Transcribed from SGLang's ``server_args.py`` (0.5.10 ``_handle_gpu_memory_settings``; 0.5.23
``arg_groups/memory_hook.py`` and ``arg_groups/cuda_graph_hook.py``); docs/sglang.md gives the
paths and the differences between versions. Pure: no I/O. The simulator computes what a
start-up does from these, and the policy assumes them for a param it was not told.
"""

from __future__ import annotations

from launcher.sglang.versions import (
    AUTO_TABLE_2_FROM,
    FA3_ANY_MHA_FROM,
    ONE_STATIC_BUDGET_FROM,
    at_least,
)

__all__ = [
    "FLASHINFER_FAMILY",
    "SPEC_DEFAULT_MAX_RUNNING_REQUESTS",
    "auto_chunked_prefill_size",
    "auto_cuda_graph_max_bs",
    "auto_mem_fraction_static",
    "capture_bs_list",
    "captured_sizes",
    "default_attention_backend",
    "flashinfer_workspace_bytes",
    "gpu_family",
    "prefill_graph_tokens",
]

def _new_table(version: str) -> bool:
    return at_least(version, AUTO_TABLE_2_FROM)


def auto_chunked_prefill_size(gpu_mem_gib: float, version: str) -> int:
    """SGLang's auto ``--chunked-prefill-size`` for a GPU of this size."""
    if gpu_mem_gib < 20:
        return 2048
    if gpu_mem_gib < 35:
        return 4096 if _new_table(version) else 2048
    if gpu_mem_gib < 60:
        return 4096
    if gpu_mem_gib < 160:
        return 8192
    return 16384


def auto_cuda_graph_max_bs(gpu_mem_gib: float, tp: int, version: str) -> int:
    """SGLang's auto decode CUDA-graph max batch size (server_args auto defaults)."""
    big_tp = tp >= 4
    if gpu_mem_gib < 20:
        return 8
    if gpu_mem_gib < 35:
        if _new_table(version):
            return 160 if big_tp else 48
        return 80 if big_tp else 24
    if gpu_mem_gib < 60:
        return 160 if big_tp else 32
    if gpu_mem_gib < 160:
        return 512 if big_tp else 256
    return 512


def auto_mem_fraction_static(
    gpu_mem_gib: float,
    tp: int,
    version: str,
    max_bs: int,
    *,
    speculative_algorithm: str | None = None,
    mla: bool = False,
) -> float:
    """SGLang's auto ``--mem-fraction-static``: (gpu_mem - reserved) / gpu_mem, rounded to 3.

    Speculative decoding: up to 0.5.10 ``reserved`` grows by 4096 MiB for EAGLE/EAGLE3/NEXTN
    (6144 for STANDALONE, nothing for NGRAM) after the 10 GiB floor (server_args.py l.1315-1322);
    0.5.23 adds nothing (memory_hook.py counts the draft inside the static budget instead).
    ``mla``: 0.5.23 reserves 1.5 GiB for the prefill graphs of MLA models instead of 8 MiB per
    shape (memory_hook.reserve_for_graph_mb)."""
    gpu_mem_mib = gpu_mem_gib * 1024
    chunk = auto_chunked_prefill_size(gpu_mem_gib, version)
    reserved = 512 + max(chunk, 2048) * 1.5 + max_bs * 2 + tp / 8 * 1024
    if gpu_mem_gib > 60:
        reserved = max(reserved, 10240)
    if _new_table(version):
        # prefill CUDA graphs (len(prefill_graph_bs) x 8 MiB, about 50 sizes; 1.5 GiB with MLA)
        reserved += 1536 if mla else 400
    if speculative_algorithm is not None and not at_least(version, ONE_STATIC_BUDGET_FROM):
        algo = speculative_algorithm.upper()
        if algo == "STANDALONE":
            reserved += 6144
        elif algo != "NGRAM":
            reserved += 4096
    return round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)


def capture_bs_list(max_bs: int, *, spec: bool = False) -> list[int]:
    """Decode batch sizes SGLang captures for ``max_bs``, ascending (captured in reverse).

    ``spec``: speculative decoding's denser list for small batches
    (``arg_groups/cuda_graph_hook.generate_decode_cuda_graph_batch_sizes``; the same list in
    0.5.10's ``server_args._generate_cuda_graph_batch_sizes``)."""
    if spec:
        sizes = [
            *range(1, 9),
            *range(10, 33, 2),
            *range(40, 65, 4),
            *range(72, 257, 8),
            *range(272, max_bs + 1, 16),
        ]
    else:
        sizes = [
            1,
            2,
            4,
            8,
            12,
            *range(16, 257, 8),
            *range(272, 512, 16),
            *range(512, max_bs + 1, 32),
        ]
    out = sorted({b for b in sizes if b <= max_bs})
    if not out or out[-1] != max_bs:
        out.append(max_bs)  # SGLang always captures max_bs itself
    return out


def captured_sizes(max_bs: int, *, spec: bool = False, cap: int | None = None) -> list[int]:
    """What the graph runners capture: :func:`capture_bs_list` clamped to the request pool
    (``req_to_token_pool.size`` = ``max_running_requests``), which SGLang adds itself when the
    list goes above it (``get_batch_sizes_to_capture``)."""
    sizes = capture_bs_list(max_bs, spec=spec)
    if cap is not None and sizes[-1] > cap:
        sizes = sorted({*(b for b in sizes if b <= cap), cap})
    return sizes


def prefill_graph_tokens(max_tokens: int) -> list[int]:
    """0.5.23's prefill-graph shapes (token counts), ascending
    (``cuda_graph_hook.generate_prefill_cuda_graph_batch_sizes``)."""
    sizes = [
        *range(4, 33, 4),
        *range(48, 257, 16),
        *range(288, 513, 32),
        *range(576, 1025, 64),
        *range(1280, 4097, 256),
        *range(4608, max_tokens + 1, 512),
    ]
    return [s for s in sizes if s <= max_tokens]


# Speculative decoding sets --max-running-requests to 48 unless given.
SPEC_DEFAULT_MAX_RUNNING_REQUESTS = 48


# --- the attention backend ------------------------------------------------------------------

# 0.5.6 utils/common.py:2758-2775 ``is_fa3_default_architecture``: the MHA architectures that
# got FA3 by default on Hopper before every MHA model did (``FA3_ANY_MHA_FROM``).
FA3_DEFAULT_ARCHS = frozenset({
    "Qwen2ForCausalLM", "Llama4ForConditionalGeneration", "LlamaForCausalLM", "Olmo2ForCausalLM",
    "Gemma2ForCausalLM", "Gemma3ForConditionalGeneration", "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM", "Glm4MoeForCausalLM", "Glm4vMoeForConditionalGeneration",
    "Step3VLForConditionalGeneration",
})
# Backends built on FlashInfer's workspace: trtllm_mha is a subclass of FlashInferAttnBackend
# (0.5.23 layers/attention/trtllm_mha_backend.py:176).
FLASHINFER_FAMILY = frozenset({"flashinfer", "trtllm_mha"})
# FlashInfer's workspace (0.5.23 environ.py:1221 ``SGLANG_FLASHINFER_WORKSPACE_SIZE`` 384 MiB);
# 512 MiB for these architectures (layers/attention/flashinfer_backend.py:421-431).
_FLASHINFER_WORKSPACE = 384 << 20
_FLASHINFER_WIDE_WORKSPACE = 512 << 20
_WIDE_WORKSPACE_ARCHS = frozenset({
    "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MiMoForCausalLM", "Qwen3VLForConditionalGeneration",
    "Qwen3VLMoeForConditionalGeneration",
})


def gpu_family(name: str) -> str:
    """The GPU family SGLang's backend choice tells apart, from nvidia-smi's name: ``hopper``
    (compute capability 9: H100, H200, H800, H20, GH200), ``sm100`` (B200, B300, GB200,
    GB300), ``hip`` (AMD Instinct), ``cuda`` (any other NVIDIA GPU), ``unknown`` (no name)."""
    n = name.upper()
    if not n.strip():
        return "unknown"
    if "AMD" in n or "INSTINCT" in n or " MI2" in n or " MI3" in n or n.startswith("MI"):
        return "hip"
    words = n.replace("-", " ").split()
    if any(w in ("H100", "H200", "H800", "H20", "GH200") for w in words):
        return "hopper"
    if any(w in ("B200", "B300", "GB200", "GB300", "B100") for w in words):
        return "sm100"
    return "cuda"


def default_attention_backend(
    gpu_name: str,
    version: str,
    *,
    mla: bool = False,
    arch: str = "",
    spec_topk: int | None = None,
) -> str:
    """The attention backend SGLang picks when ``--attention-backend`` is unset (0.5.23
    arg_groups/model_override_base.py:277-350 ``get_default_attn_backend``, logged by
    arg_groups/overrides.py:1126-1139 "Attention backend not specified. Use ... by default.").

    MHA: ``fa3`` on Hopper unless speculative decoding runs with topk > 1
    (utils/common.py:3960 ``is_no_spec_infer_or_topk_one``; before ``FA3_ANY_MHA_FROM`` only for
    ``FA3_DEFAULT_ARCHS``); ``trtllm_mha`` on SM100 (same condition; FlashInfer before
    ``FA3_ANY_MHA_FROM``); ``aiter`` on AMD; else ``flashinfer``. MLA: ``fa3`` on Hopper,
    ``flashinfer`` on SM100, else ``triton`` (``aiter`` on AMD for 16 or 128 heads: read as
    ``aiter``). An unknown GPU reads as ``flashinfer``, the backend with the larger buffers."""
    family = gpu_family(gpu_name)
    topk_one = spec_topk is None or spec_topk == 1
    if mla:
        return {"hopper": "fa3", "sm100": "flashinfer", "hip": "aiter",
                "unknown": "flashinfer"}.get(family, "triton")
    if family == "hopper" and topk_one and (at_least(version, FA3_ANY_MHA_FROM)
                                             or arch in FA3_DEFAULT_ARCHS):
        return "fa3"
    if family == "sm100" and topk_one and at_least(version, FA3_ANY_MHA_FROM):
        return "trtllm_mha"
    if family == "hip":
        return "aiter"
    return "flashinfer"


def flashinfer_workspace_bytes(arch: str) -> int:
    """FlashInfer's workspace buffer for a model architecture (384 MiB; 512 MiB for Qwen2/
    Qwen3/MiMo/Qwen3-VL: layers/attention/flashinfer_backend.py:421-431, 0.5.23)."""
    return _FLASHINFER_WIDE_WORKSPACE if arch in _WIDE_WORKSPACE_ARCHS else _FLASHINFER_WORKSPACE

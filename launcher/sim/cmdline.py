"""The simulated server's command line: SGLang's flags, reduced to the ones the simulator
knows, parsed in the dialect of one SGLang version (``build_parser``) into ``Flags``.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from launcher.sim.logfmt import Dialect


def _si_int(text: str) -> int:
    """0.5.23's ``128k``-style integers."""
    factors = {"k": 1000, "m": 1000**2, "g": 1000**3}
    suffix = text[-1:].lower()
    if suffix in factors:
        return int(float(text[:-1]) * factors[suffix])
    return int(text)


# --lora-target-modules' choices: utils/common.py SUPPORTED_LORA_TARGET_MODULES + ["all"]
# (0.5.10 l.3294-3308; 0.5.23 l.4700-4724)
LORA_TARGETS_0510 = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                     "down_proj", "qkv_proj", "gate_up_proj", "embed_tokens", "lm_head")
LORA_TARGETS_0523 = ("q_proj", "k_proj", "v_proj", "o_proj", "q_a_proj", "kv_a_proj_with_mqa",
                     "q_b_proj", "kv_b_proj", "wq_b", "wk", "weights_proj", "gate_proj",
                     "up_proj", "down_proj", "qkv_proj", "gate_up_proj", "embed_tokens",
                     "lm_head", "qkvr", "wo_ud")


class LoRAPathAction(argparse.Action):
    """SGLang's ``LoRAPathAction`` (0.5.23 ``arg_groups/argparse_actions.py:8-25``): each value
    stripped; one written as a JSON object is parsed (a malformed one raises, as SGLang's
    does)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        paths: list[Any] = []
        for value in values or []:
            value = value.strip()
            if value.startswith("{") and value.endswith("}"):
                obj = json.loads(value)
                assert "lora_path" in obj and "lora_name" in obj, value
                paths.append(obj)
            else:
                paths.append(value)
        setattr(namespace, self.dest, paths)


def build_parser(d: Dialect) -> argparse.ArgumentParser:
    """SGLang's argument parser, reduced to the flags the simulator knows, in ``d``'s dialect.

    Prefix matching stays on (``--tp`` works; 0.5.23's ``--cuda-graph-max-bs`` is ambiguous)."""
    p = argparse.ArgumentParser(prog=d.prog)
    num = _si_int if d.since(0, 5, 23) else int
    add = p.add_argument
    add("--model-path", "--model", dest="model_path", type=str, required=True)
    add("--served-model-name", type=str, default=None)
    # Up to 0.5.10 the long spelling comes first (error lines say --tensor-parallel-size/--tp-size).
    tp_flags = ["--tp-size", "--tensor-parallel-size"]
    dp_flags = ["--dp-size", "--data-parallel-size"]
    if not d.since(0, 5, 15):
        tp_flags.reverse()
        dp_flags.reverse()
    add(*tp_flags, dest="tp_size", type=int, default=1)
    add(*dp_flags, dest="dp_size", type=int, default=1)
    add("--host", type=str, default="127.0.0.1")
    add("--port", type=int, default=30000)
    add("--mem-fraction-static", type=float, default=None)
    if d.since(0, 5, 15):
        add("--cuda-graph-max-bs-decode", type=int, default=None)
        add("--cuda-graph-max-bs-prefill", type=int, default=None)
        if not d.since(0, 5, 23):
            add(
                "--cuda-graph-max-bs",
                dest="cuda_graph_max_bs_alias",
                type=int,
                default=None,
                help="Deprecated alias of --cuda-graph-max-bs-decode.",
            )
    else:
        add("--cuda-graph-max-bs", type=int, default=None)
    add("--context-length", type=num, default=None)
    add("--chunked-prefill-size", type=int, default=None)
    add("--max-running-requests", type=int, default=None)
    add("--max-total-tokens", type=num, default=None)
    add("--log-level", type=str, default="info")
    add("--log-level-http", type=str, default=None)
    add("--trust-remote-code", action="store_true")
    add("--revision", type=str, default=None)
    add("--nnodes", type=int, default=1)
    add("--node-rank", type=int, default=0)
    add("--dist-init-addr", "--nccl-init-addr", dest="dist_init_addr", type=str, default=None)
    add("--skip-server-warmup", action="store_true")
    add("--disable-cuda-graph", action="store_true")
    add("--enable-torch-compile", action="store_true")
    add("--torch-compile-max-bs", type=int, default=32)
    add("--api-key", type=str, default=None)
    add("--watchdog-timeout", type=float, default=300)
    add("--dist-timeout", type=int, default=None)
    if d.since(0, 5, 23):
        add("--gated-launch-port", type=int, default=None)
    add("--enable-metrics", action="store_true")
    add("--kv-cache-dtype", type=str, default="auto")
    add("--quantization", type=str, default=None)
    add("--attention-backend", type=str, default=None)
    add("--random-seed", type=int, default=None)
    add("--dtype", type=str, default="auto")
    add("--load-format", type=str, default="auto")
    if d.since(0, 5, 23):
        add("--speculative-algorithm", type=str, default=None)
    else:
        add(
            "--speculative-algorithm",
            type=str,
            default=None,
            choices=["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"],
        )
    add(
        "--speculative-draft-model-path",
        "--speculative-draft-model",
        dest="speculative_draft_model_path",
        type=str,
        default=None,
    )
    add("--speculative-draft-model-revision", type=str, default=None)
    add("--speculative-num-steps", type=int, default=None)
    add("--speculative-eagle-topk", type=int, default=None)
    add("--speculative-num-draft-tokens", type=int, default=None)
    add("--max-mamba-cache-size", type=int, default=None)
    add("--mamba-ssm-dtype", type=str, default=None, choices=["float32", "bfloat16", "float16"])
    # 0.5.23 leaves it None and falls back to 0.9 when sizing; 0.5.10 defaults to 0.9.
    add("--mamba-full-memory-ratio", type=float, default=None if d.since(0, 5, 23) else 0.9)
    if d.since(0, 5, 23):
        # --mamba-scheduler-strategy is gone: argparse's "unrecognized arguments", exit 2.
        add(
            "--mamba-radix-cache-strategy",
            dest="mamba_strategy",
            type=str,
            default="auto",
            choices=["auto", "no_buffer", "extra_buffer", "extra_buffer_lazy"],
        )
    else:
        add(
            "--mamba-scheduler-strategy",
            dest="mamba_strategy",
            type=str,
            default="auto",
            choices=["auto", "no_buffer", "extra_buffer"],
        )
    add("--disable-radix-cache", action="store_true")
    add("--disable-overlap-schedule", action="store_true")
    # LoRA (0.5.10 server_args.py:4578-4620; 0.5.23 arg_groups/fields/lora.py:34-69)
    add("--enable-lora", action="store_true", default=None)
    add("--max-lora-rank", type=int, default=None)
    targets = LORA_TARGETS_0523 if d.since(0, 5, 23) else LORA_TARGETS_0510
    add("--lora-target-modules", type=str, nargs="*", default=None,
        choices=[*targets, "all"])
    add("--lora-paths", type=str, nargs="*", default=None, action=LoRAPathAction)
    add("--max-loras-per-batch", type=int, default=8)
    return p


@dataclass(frozen=True)
class Flags:
    """The parsed command line, typed."""

    model_path: str
    served_model_name: str
    tp: int
    dp: int
    host: str
    port: int
    mem_fraction_static: float | None
    graph_bs: int | None
    graph_bs_prefill: int | None
    context_length: int | None
    chunked_prefill_size: int | None
    max_running_requests: int | None
    max_total_tokens: int | None
    log_level: str
    log_level_http: str | None
    trust_remote_code: bool
    nnodes: int
    node_rank: int
    dist_init_addr: str | None
    skip_server_warmup: bool
    disable_cuda_graph: bool
    enable_torch_compile: bool
    torch_compile_max_bs: int
    api_key: str | None
    watchdog_timeout: float
    dist_timeout: int | None
    enable_metrics: bool
    kv_cache_dtype: str
    quantization: str | None
    attention_backend: str | None
    random_seed: int
    dtype: str
    load_format: str
    speculative_algorithm: str | None
    deprecated_graph_flag: bool
    speculative_draft_model_path: str | None = None
    speculative_draft_model_revision: str | None = None
    revision: str | None = None  # of a Hub id model path (launcher.sim.hub)
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    max_mamba_cache_size: int | None = None
    mamba_ssm_dtype: str | None = None
    mamba_full_memory_ratio: float | None = None
    mamba_strategy: str = "auto"  # --mamba-scheduler-strategy (<= 0.5.10) / -radix-cache- (0.5.23)
    disable_radix_cache: bool = False
    disable_overlap_schedule: bool = False
    gated_launch_port: int | None = None
    enable_lora: bool | None = None
    max_lora_rank: int | None = None
    lora_target_modules: list[str] | None = None
    lora_paths: list[Any] | None = None  # str entries, or {"lora_name", "lora_path"} objects
    max_loras_per_batch: int = 8

    @classmethod
    def parse(cls, d: Dialect, argv: Sequence[str]) -> Flags:
        """Parse like SGLang; argparse errors exit 2 with SGLang's message."""
        ns = build_parser(d).parse_args(list(argv))
        v: dict[str, Any] = vars(ns)
        decode = v.pop("cuda_graph_max_bs_decode", None)
        legacy = v.pop("cuda_graph_max_bs", None)
        alias = v.pop("cuda_graph_max_bs_alias", None)
        graph_bs = next((b for b in (decode, legacy, alias) if b is not None), None)
        prefill = v.pop("cuda_graph_max_bs_prefill", None)
        tp, dp = v.pop("tp_size"), v.pop("dp_size")
        seed = v.pop("random_seed")
        served = v.pop("served_model_name") or v["model_path"]
        return cls(
            tp=tp,
            dp=dp,
            graph_bs=graph_bs,
            graph_bs_prefill=prefill,
            random_seed=random.randint(0, 1 << 30) if seed is None else seed,
            served_model_name=served,
            deprecated_graph_flag=alias is not None,
            **v,
        )

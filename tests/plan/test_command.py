"""The SGLang command line of an attempt, in the flag dialect of its version."""

from __future__ import annotations

import pytest

from launcher.params import LaunchParams
from launcher.plan.command import build_command
from launcher.sglang.flags import (
    env_is_read,
    graph_bs_flag,
    mamba_strategy_flag,
    params_argv,
    params_from_argv,
)


def cmd(version: str, params: LaunchParams, **kw: object) -> list[str]:
    base: dict[str, object] = dict(
        command=["python3", "-m", "sglang.launch_server"], model_path="/m", tp=4, dp=1,
        port=30000, listen="127.0.0.1", gpus=[0, 1, 2, 3], params=params, sglang_version=version,
    )
    base.update(kw)
    return build_command(**base).argv  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("version", "flag"),
    [("0.4.10.post2", "--cuda-graph-max-bs"), ("0.5.6.post2", "--cuda-graph-max-bs"),
     ("0.5.10", "--cuda-graph-max-bs"), ("0.5.15", "--cuda-graph-max-bs-decode"),
     ("0.5.23", "--cuda-graph-max-bs-decode")],
)
def test_graph_bs_flag_follows_version(version: str, flag: str) -> None:
    """Up to 0.5.10 the flag is --cuda-graph-max-bs; from 0.5.15 it is -decode."""
    assert flag == graph_bs_flag(version)
    argv = cmd(version, LaunchParams(0.6, 16))
    assert [flag, "16"] == argv[argv.index(flag):argv.index(flag) + 2]


def test_auto_params_pass_no_flag() -> None:
    """None (auto) leaves both memory flags out so SGLang picks its defaults."""
    argv = cmd("0.5.23", LaunchParams(None, None))
    assert not [a for a in argv if "mem-fraction" in a or "cuda-graph" in a]


def test_fraction_is_written_compactly() -> None:
    """0.600 is passed as 0.6 and 0.835 stays 0.835."""
    assert "0.6" == cmd("0.5.23", LaunchParams(0.6, None))[-3]
    assert "0.835" == cmd("0.5.23", LaunchParams(0.835, None))[-3]


def test_log_level_info_is_forced_and_extra_args_follow() -> None:
    """--log-level info precedes the extra args (a later flag would win in argparse)."""
    argv = cmd("0.5.23", LaunchParams(), extra_args=["--context-length", "8192"])
    assert ["--log-level", "info", "--context-length", "8192"] == argv[-4:]


def test_env_has_gpus_and_attempt_and_secrets_stay_out_of_argv() -> None:
    """GPUs become CUDA_VISIBLE_DEVICES; secret values live only in secret_env."""
    c = build_command(
        command=["sglang", "serve"], model_path="/m", tp=2, dp=1, port=1, listen="0.0.0.0",
        gpus=[4, 5], params=LaunchParams(), sglang_version="0.5.23",
        secret_env={"HF_TOKEN": "hf_secret"}, attempt=3, server_name="llama",
    )
    assert "4,5" == c.env["CUDA_VISIBLE_DEVICES"]
    assert ("3", "llama") == (c.env["LAUNCHER_ATTEMPT"], c.env["LAUNCHER_SERVER"])
    assert not any("hf_secret" in a for a in c.argv)
    assert "***" == c.masked_env()["HF_TOKEN"]


@pytest.mark.parametrize(
    ("version", "flag"),
    [("0.5.10", "--mamba-scheduler-strategy"), ("0.5.15", "--mamba-radix-cache-strategy"),
     ("0.5.23", "--mamba-radix-cache-strategy")],
)
def test_mamba_strategy_flag_follows_version(version: str, flag: str) -> None:
    """0.5.23 rejects --mamba-scheduler-strategy; 0.5.10 has no --mamba-radix-cache-strategy."""
    assert flag == mamba_strategy_flag(version)
    argv = cmd(version, LaunchParams(mamba_strategy="extra_buffer"))
    assert [flag, "extra_buffer"] == argv[argv.index(flag):argv.index(flag) + 2]


def test_running_requests_and_mamba_knobs_are_rendered() -> None:
    p = LaunchParams(0.7, 16, max_running_requests=24, max_mamba_cache_size=96,
                     mamba_full_memory_ratio=0.5)
    assert [
        "--mem-fraction-static", "0.7", "--cuda-graph-max-bs-decode", "16",
        "--max-running-requests", "24", "--max-mamba-cache-size", "96",
        "--mamba-full-memory-ratio", "0.5",
    ] == params_argv(p, "0.5.23")


def test_params_env_overrides_the_configured_env() -> None:
    """A relaunch's SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1 wins over the config's 0."""
    p = LaunchParams(0.6, 16).with_env("SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH", "1")
    c = build_command(
        command=["sglang", "serve"], model_path="/m", tp=1, dp=1, port=1, listen="127.0.0.1",
        gpus=[0], params=p, sglang_version="0.5.23",
        env={"SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH": "0", "NCCL_DEBUG": "WARN"},
    )
    assert ("1", "WARN") == (c.env["SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH"], c.env["NCCL_DEBUG"])


def test_spec_v2_env_is_read_only_before_its_removal() -> None:
    assert env_is_read("SGLANG_ENABLE_SPEC_V2", "0.5.10")
    assert not env_is_read("SGLANG_ENABLE_SPEC_V2", "0.5.23")
    assert env_is_read("SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH", "0.5.23")


@pytest.mark.parametrize("version", ["0.5.10", "0.5.23"])
def test_params_from_argv_inverts_params_argv(version: str) -> None:
    """What an adopted attempt's cmd and env files say gives back the params it ran with."""
    p = LaunchParams(0.655, 24, max_running_requests=24, max_mamba_cache_size=64,
                     mamba_full_memory_ratio=0.4, mamba_strategy="extra_buffer",
                     env=(("SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH", "1"),))
    argv = cmd(version, p, extra_args=["--speculative-num-steps", "3"])
    env = ["export HF_TOKEN='secret'", "export SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH='1'"]
    assert p == params_from_argv([f"'{a}'" for a in argv], env)

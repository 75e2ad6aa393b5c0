"""launcher/sglang/flags.py is the one table of owned flags: what ``command`` writes for any
param in any supported version is owned (config refuses it in extra_args) and read back."""

from __future__ import annotations

import dataclasses

import pytest

from launcher.params import LaunchParams
from launcher.sglang.flags import (
    OWNED_FLAGS,
    PARAM_FLAGS,
    PARAM_SWITCHES,
    PARAM_TYPES,
    params_argv,
    params_from_argv,
)
from launcher.sglang.versions import SUPPORTED_VERSIONS

ALL_SET = LaunchParams(
    mem_fraction_static=0.8, cuda_graph_max_bs=64, max_running_requests=32,
    max_mamba_cache_size=100, mamba_full_memory_ratio=0.5, mamba_strategy="extra_buffer",
)


def test_every_param_field_has_a_flag_type() -> None:
    fields = {f.name for f in dataclasses.fields(LaunchParams)} - {"env"}
    assert fields == set(PARAM_TYPES) | set(PARAM_SWITCHES)
    assert fields - set(PARAM_SWITCHES) == set(PARAM_FLAGS.values())
    assert all(flag in OWNED_FLAGS for flag in PARAM_SWITCHES.values())


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_what_command_writes_is_owned_and_read_back(version: str) -> None:
    argv = params_argv(ALL_SET, version)
    written = argv[0::2]
    assert len(written) == len(PARAM_TYPES)
    for flag in written:
        assert flag in OWNED_FLAGS, f"{flag} ({version}) is written but not owned"
        assert flag in PARAM_FLAGS
    assert ALL_SET == params_from_argv(argv)

"""The three deployments of docs/incidents.md ("the seeds") end to end: launcher supervising the
simulated SGLang host with their hardware and numbers, on SGLang 0.5.10 and 0.5.23.

- DeepSeek-V4-Flash with MTP (EAGLE 1/1/2), tp 4 on RTX PRO 6000 (94.97 GiB), 0.70 / graph bs 32
  (incidents 1 and 2): its capture OOM ("Tried to allocate 7.50 GiB ... 2.30 GiB is free ...
  this process has 92.67 GiB memory in use"), then ready within 3 attempts, the MTP parameters
  never changed.
- Kimi-K2.5 with an EAGLE-3 draft, tp 8 (incident 3): a capture OOM in the draft's graphs at
  0.93 / bs 128 (no incident figure pins the fraction: 0.92 until the draft decode graph was
  charged one step's activations, as SGLang runs it), then ready; the incident's 0.88 comes up.
- Qwen3.6-27B hybrid with MTP (incident 4), launched with ``no_buffer`` as in the incident: 0.5.10's
  spec + no_buffer ValueError names its fix (``--mamba-scheduler-strategy extra_buffer`` and
  ``SGLANG_ENABLE_SPEC_V2=1``). 0.5.23 has no such error (its ``auto`` resolves to ``extra_buffer``
  under the default overlap schedule); a forced ``no_buffer`` fails ``validate_mamba_no_buffer``
  ("Try to set disable_overlap_schedule=True."), whose fix is ``--disable-overlap-schedule``. With
  ``[policy] apply_prescribed_fixes`` the fix is applied once and the server comes up. The same
  model at 0.56 on 0.5.23 meets the state-cache error and comes up after one relaunch with its
  running requests untouched.

The expected outcomes come from the incidents (docs/incidents.md), not from what launcher's
classifier or policy say.
"""

from __future__ import annotations

import shlex
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from launcher.supervise.lifecycle import State
from tests.simhost import model_dir
from tests.supervise import SimSetup, ready_or_done, supervise

pytestmark = pytest.mark.timeout(90)

PRO6000 = 94.97
VERSIONS = ("0.5.10", "0.5.23")
MTP_FLAGS = {
    "--speculative-algorithm": "EAGLE",
    "--speculative-num-steps": "1",
    "--speculative-eagle-topk": "1",
    "--speculative-num-draft-tokens": "2",
}
EAGLE3_FLAGS = {
    "--speculative-algorithm": "EAGLE3",
    "--speculative-draft-model-path": str(model_dir("kimi-k2.5-eagle3-sim")),
    "--speculative-num-steps": "3",
    "--speculative-eagle-topk": "1",
    "--speculative-num-draft-tokens": "4",
}
QWEN_MTP_FLAGS = {
    "--speculative-algorithm": "NEXTN",
    "--speculative-num-steps": "3",
    "--speculative-eagle-topk": "1",
    "--speculative-num-draft-tokens": "4",
}


def _args(flags: dict[str, str]) -> list[str]:
    return [word for pair in flags.items() for word in pair]


def _flag(cmd: str, flag: str) -> str | None:
    words = shlex.split(cmd)
    return words[words.index(flag) + 1] if flag in words else None


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[SimSetup]:
    """Eight RTX PRO 6000s (94.97 GiB each), as in the seeds."""
    setup = SimSetup.create(tmp_path, gpu_count=8, gpu_total_gib=PRO6000)
    try:
        yield setup
    finally:
        setup.cleanup()


def _server(version: str, flags: dict[str, str]) -> dict[str, Any]:
    """The [[servers]] keys of a seed deployment on the simulated ``version``."""
    return {
        "sglang_version": version,
        "extra_args": _args(flags),
        "env": {"SGLANG_SIM_VERSION": version},
    }


@pytest.mark.parametrize("version", VERSIONS)
async def test_deepseek_mtp_capture_oom_then_ready_with_mtp_unchanged(
    rig: SimSetup, version: str
) -> None:
    """The seeds' OOM text on attempt 1, ready by attempt 3, steps/topk/draft tokens as set."""
    config = rig.config(
        model="deepseek-v4-flash-sim",
        tp=4,
        mem_fraction_static=0.70,
        cuda_graph_max_bs=32,
        server=_server(version, MTP_FLAGS),
    )
    result = await supervise(config, until=ready_or_done, timeout=80)
    rec = result.events
    assert State.READY == result.supervisor.state, rec.summary()
    failed = rec.of("attempt.failed")
    assert failed and "oom_graph_capture" == failed[0]["outcome"]
    assert (7.5, 2.3, 94.97) == (
        failed[0]["numbers"]["tried_gib"],
        failed[0]["numbers"]["free_gib"],
        failed[0]["numbers"]["total_gib"],
    )
    log1 = rig.log(1)
    assert (
        "Tried to allocate 7.50 GiB. GPU 0 has a total capacity of 94.97 GiB of which 2.30 GiB is "
        "free. Including non-PyTorch memory, this process has 92.67 GiB memory in use."
    ) in log1
    attempts = rig.attempts()
    assert len(attempts) <= 3, rec.summary()
    for attempt in attempts:
        cmd = rig.cmd(attempt)
        assert {f: _flag(cmd, f) for f in MTP_FLAGS} == MTP_FLAGS, cmd


@pytest.mark.parametrize("version", VERSIONS)
async def test_kimi_eagle3_capture_oom_then_ready(rig: SimSetup, version: str) -> None:
    """The EAGLE-3 launch at 0.93 / bs 128 OOMs capturing the draft's graphs (0.5.23: draft
    decode's first step, 0.25 GiB with 0.13 free; 0.5.10: draft extend's, 0.97 with 0.66
    free: tests/sim/test_sim_spec.py), then comes up; the draft and its parameters are kept."""
    config = rig.config(
        model="kimi-k2.5-sim",
        tp=8,
        mem_fraction_static=0.93,
        cuda_graph_max_bs=128,
        server=_server(version, EAGLE3_FLAGS),
    )
    result = await supervise(config, until=ready_or_done, timeout=80)
    rec = result.events
    assert State.READY == result.supervisor.state, rec.summary()
    failed = rec.of("attempt.failed")
    assert failed and "oom_graph_capture" == failed[0]["outcome"]
    assert "type=LlamaForCausalLMEagle3," in rig.log(1)
    for attempt in rig.attempts():
        cmd = rig.cmd(attempt)
        assert {f: _flag(cmd, f) for f in EAGLE3_FLAGS} == EAGLE3_FLAGS, cmd


def _qwen(rig: SimSetup, version: str, policy: dict[str, Any] | None = None) -> Any:
    """The seed's launch: no_buffer (rendered in each version's flag dialect), overlap left on."""
    return rig.config(
        model="qwen3.6-27b-sim",
        tp=1,
        mem_fraction_static=0.90,
        server={**_server(version, QWEN_MTP_FLAGS), "mamba_strategy": "no_buffer"},
        policy=policy,
    )


def _config_change(text: str) -> dict[str, Any]:
    """The TOML after "Config change:" in ``text``, parsed: the [[servers]] table to set."""
    _, marker, snippet = text.partition("Config change:\n")
    assert marker, text
    [server] = tomllib.loads(snippet)["servers"]
    assert isinstance(server, dict)
    return server


@pytest.mark.parametrize("version", VERSIONS)
async def test_qwen_hybrid_no_buffer_error_names_the_exact_fix(rig: SimSetup, version: str) -> None:
    """The no_buffer error stops the server after one attempt; the give-up carries the fix in
    the server's own dialect: 0.5.10 extra_buffer plus SGLANG_ENABLE_SPEC_V2=1, 0.5.23
    --disable-overlap-schedule (the fix its no_buffer assertion names) and no removed
    environment variable."""
    result = await supervise(_qwen(rig, version), until=ready_or_done, timeout=60)
    rec = result.events
    assert State.GAVE_UP == result.supervisor.state, rec.summary()
    assert [1] == rig.attempts()
    log1 = rig.log(1)
    if version == "0.5.10":
        assert "--mamba-scheduler-strategy no_buffer.To use radix cache" in log1
    else:
        assert "AssertionError: no_buffer do not support overlap schedule." in log1
    [gave_up] = rec.of("server.gave_up")
    reason = str(gave_up["reason"])
    # The fix as valid TOML for the server's table in launcher's config keys (the raw error text
    # alone does not do: it writes SGLANG_ENABLE_SPEC_V2=1 and disable_overlap_schedule=True),
    # in the give-up reason (the `up` output) and the failed attempt's advice (Slack, diagnose).
    [failed] = rec.of("attempt.failed")
    for text in (reason, str(failed["advice"])):
        change = _config_change(text)
        if version == "0.5.10":
            assert {"mamba_strategy": "extra_buffer",
                    "env": {"SGLANG_ENABLE_SPEC_V2": "1"}} == change, text
            assert "--mamba-scheduler-strategy extra_buffer" in text
        else:
            assert {"disable_overlap_schedule": True} == change, text
            assert "--disable-overlap-schedule" in text
            assert "SGLANG_ENABLE_SPEC_V2" not in text


@pytest.mark.parametrize("version", VERSIONS)
async def test_qwen_hybrid_prescribed_fix_applied_once_then_ready(
    rig: SimSetup, version: str
) -> None:
    """With ``apply_prescribed_fixes``, launcher applies the error's fix once and the second
    attempt is ready; MTP parameters unchanged."""
    config = _qwen(rig, version, policy={"apply_prescribed_fixes": True})
    result = await supervise(config, until=ready_or_done, timeout=60)
    rec = result.events
    assert State.READY == result.supervisor.state, rec.summary()
    assert [1, 2] == rig.attempts()
    cmd = rig.cmd(2)
    for f, v in QWEN_MTP_FLAGS.items():
        assert v == _flag(cmd, f), cmd
    words = shlex.split(cmd)
    if version == "0.5.10":
        assert "extra_buffer" == _flag(cmd, "--mamba-scheduler-strategy")
        # The env file is removed once the server read it; the command file shows the
        # settings a relaunch put in the environment ahead of the argv.
        assert "SGLANG_ENABLE_SPEC_V2=1" == words[0], cmd
    else:
        # The user's no_buffer kept, in 0.5.23's spelling, with the overlap schedule off.
        assert "no_buffer" == _flag(cmd, "--mamba-radix-cache-strategy")
        assert "--mamba-scheduler-strategy" not in words
        assert "--disable-overlap-schedule" in words


async def test_qwen_hybrid_state_cache_error_then_ready_with_its_running_requests(
    rig: SimSetup,
) -> None:
    """The seed's Qwen3.6-27B + MTP on 0.5.23 (auto strategy) at 0.56: SGLang's "Not enough GPU
    memory for hybrid (mamba/linear-attention) state cache" (kv_cache_configurator.py:3394),
    then one relaunch at a higher fraction, ready; no --max-running-requests is added (0.5.23
    sizes the state cache without it) and the MTP parameters are unchanged."""
    config = rig.config(model="qwen3.6-27b-sim", tp=1, mem_fraction_static=0.56,
                        server=_server("0.5.23", QWEN_MTP_FLAGS))
    result = await supervise(config, until=ready_or_done, timeout=60)
    rec = result.events
    assert State.READY == result.supervisor.state, rec.summary()
    assert [1, 2] == rig.attempts()
    assert "RuntimeError: Not enough GPU memory for hybrid" in rig.log(1)
    cmd = rig.cmd(2)
    assert float(_flag(cmd, "--mem-fraction-static") or 0) > 0.56
    assert "--max-running-requests" not in shlex.split(cmd)
    assert {f: _flag(cmd, f) for f in QWEN_MTP_FLAGS} == QWEN_MTP_FLAGS, cmd

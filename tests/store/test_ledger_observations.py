"""The ledger's observations table (real SQLite files): recording, reading back, the migration
of a ledger written before it existed, and the event recorder feeding it from a real log."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from launcher.hooks.recorder import LedgerRecorder
from launcher.memory.calibration import CostGuess, ObservationKey, learn
from launcher.params import LaunchParams
from launcher.sglang.logparse import LogFollower
from launcher.sglang.observed import Observed
from launcher.store.ledger import _MIGRATIONS, SCHEMA_VERSION, Ledger, ObservationContext
from launcher.supervise import events as ev

KEY = ObservationKey("Qwen3ForCausalLM", "NVIDIA H200", "0.5.23", "")
GUESS = CostGuess(weights_gib=30.0, kv_bytes_per_token=65536.0,
                  graph_gib={"target_decode": 0.5}, graph_bs=256, activations_gib=2.0)
OBS = Observed(weights_gib=30.73, kv_tokens=1106880, kv_pool_gib=76.06,
               graph_mem_gib={"target_decode": 0.66}, graph_max_bs=256, ready_avail_gib=28.14)
P = LaunchParams(0.812, 256)


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_an_observation_is_keyed_to_its_attempt_and_reads_back(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        assert not ledger.record_observation(
            "qwen", 1, KEY, OBS, outcome="ready", params=P, at=10.0)  # no attempt row yet
        ledger.attempt_started("qwen", "fp1", 1, P, 5.0)
        assert ledger.record_observation("qwen", 1, KEY, OBS, outcome="ready", params=P,
                                         estimate=GUESS, model="/m/Qwen3-32B", tp=2, at=10.0)
        [row] = ledger.observations()
        [attempt] = ledger.history()
        assert attempt.id == row.attempt_id
        assert (KEY, OBS, GUESS, "ready", P) == (
            row.key, row.observed, row.estimate, row.outcome, row.params)
        assert ("/m/Qwen3-32B", 2) == (row.model, row.tp)
        assert [] == ledger.observations(architecture="LlamaForCausalLM")
        assert [row] == ledger.observations(architecture=KEY.architecture,
                                            gpu_model=KEY.gpu_model)
        # The attempt ends again (failed while serving): the figures are replaced, the
        # estimate it started from is kept.
        later = Observed(weights_gib=30.73, ready_avail_gib=28.14, tried_gib=4.0, free_gib=1.0)
        ledger.record_observation("qwen", 1, KEY, later, outcome="oom_runtime", params=P,
                                  at=20.0)
        [row] = ledger.observations()
        assert (later, GUESS, "oom_runtime") == (row.observed, row.estimate, row.outcome)
        # A restarted daemon starting attempt 1 afresh: what it observed goes too.
        ledger.attempt_started("qwen", "fp1", 1, P, 30.0)
        assert [] == ledger.observations()


def test_a_ledger_written_before_observations_opens_and_migrates(tmp_path: Path) -> None:
    """A schema-2 file, written by the released migration steps as launcher wrote them
    (steps are never edited), with an attempt and last good params in it."""
    path = tmp_path / "ledger.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    for step in _MIGRATIONS[:2]:
        for statement in step:
            conn.execute(statement)
    conn.execute("PRAGMA user_version = 2")
    conn.execute(
        "INSERT INTO attempts (server, fingerprint, attempt, mem_fraction_static, "
        "cuda_graph_max_bs, started_at, ended_at, outcome, phase, numbers) "
        "VALUES ('qwen', 'fp1', 1, 0.8, 128, 1.0, 2.0, 'ready', 'ready', '{\"weights_gib\": 30}')")
    conn.execute(
        "INSERT INTO last_good (fingerprint, server, mem_fraction_static, cuda_graph_max_bs, "
        "updated_at, attempts) VALUES ('fp1', 'qwen', 0.8, 128, 2.0, 1)")
    conn.close()
    with Ledger(path) as ledger:
        assert SCHEMA_VERSION == ledger.schema_version
        [old] = ledger.history()
        assert ("ready", {"weights_gib": 30}) == (old.outcome, old.numbers)
        assert LaunchParams(0.8, 128) == ledger.last_good("fp1")
        assert [] == ledger.observations()
        assert ledger.record_observation("qwen", 1, KEY, OBS, outcome="ready",
                                         params=LaunchParams(0.8, 128), at=3.0)
    with Ledger(path) as ledger:  # and reopens with nothing to migrate
        assert 1 == len(ledger.observations())


# 0.5.23 line formats (see tests/sglang/test_observed.py for their source lines).
READY_LOG = [
    "[2026-05-02 08:31:40] server_args={'model_path': '/m/Qwen3-32B', "
    "'speculative_algorithm': 'EAGLE3', 'speculative_num_steps': 3, "
    "'speculative_eagle_topk': 1, 'speculative_num_draft_tokens': 4, 'cuda_graph_max_bs': 64}",
    "[2026-05-02 08:31:52 TP0] Load weight end. elapsed=31.02 s, type=Qwen3ForCausalLM, "
    "avail mem=106.75 GB, mem usage=30.73 GB.",
    "[2026-05-02 08:31:53 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1106880, "
    "K size: 38.03 GB, V size: 38.03 GB",
    "[2026-05-02 08:32:00 TP0] Capture target verify CUDA graph begin. backend=full, "
    "num_tokens_per_req=4, avail mem=28.80 GB",
    "[2026-05-02 08:32:10 TP0] Capture target verify CUDA graph end. bs=[1, 2, 4, 8, 16, 32, "
    "64], elapsed=10.00 s, mem usage=0.66 GB, avail mem=28.14 GB.",
    "[2026-05-02 08:32:11 TP0] max_total_num_tokens=1106880, chunked_prefill_size=8192, "
    "max_prefill_tokens=16384, max_running_requests=48, context_len=40960, "
    "available_gpu_mem=28.14 GB",
    "[2026-05-02 08:32:15] The server is fired up and ready to roll!",
]


async def test_the_recorder_files_an_ended_attempts_figures_under_its_key(
        tmp_path: Path) -> None:
    follower = LogFollower()
    for line in READY_LOG:
        follower.feed_line(line)
    numbers = follower.numbers.as_dict()
    params = LaunchParams(0.812, 64)
    context = ObservationContext(ObservationKey("Qwen3ForCausalLM", "NVIDIA H200", "0.5.23"),
                                 model="/m/Qwen3-32B", tp=2)
    clock = FakeClock(1000.0)
    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        async with LedgerRecorder(ledger, {"qwen": "fp1"}, clock,
                                  contexts={"qwen": context}) as hook:
            hook("qwen", ev.AttemptStarted(attempt=1, params=params, estimate=GUESS))
            hook("qwen", ev.ServerReady(attempt=1, attempts=1, seconds=40.0,
                                        attempt_seconds=40.0, adopted=False, params=params,
                                        history=()))
            # what the supervisor sends for a ready attempt (_ready_attempt_ended)
            hook("qwen", ev.AttemptEnded(
                attempt=1, params=params, outcome="ready", phase="ready",
                numbers=numbers, evidence=(), advice="", started_at=960.0, ended_at=1000.0,
                log_tail="", tail_path=None,
            ))
            # an attempt whose log showed no figure records no observation
            hook("qwen", ev.AttemptStarted(attempt=2, params=params))
            hook("qwen", ev.AttemptEnded(
                attempt=2, params=params, outcome="port_in_use", phase="init",
                numbers={"mem_fraction_static": 0.812}, evidence=(), advice="",
                started_at=None, ended_at=1001.0, log_tail="", tail_path=None,
            ))
            assert await hook.flush()
        [row] = ledger.observations()
    assert 1 == row.attempt
    # the speculative settings come from the log's args dump
    assert ObservationKey("Qwen3ForCausalLM", "NVIDIA H200", "0.5.23",
                          "EAGLE3 steps=3 topk=1 draft=4") == row.key
    assert GUESS == row.estimate
    assert (30.73, 76.06, {"target_verify": 0.66}, 64, 28.14) == (
        row.observed.weights_gib, row.observed.kv_pool_gib, dict(row.observed.graph_mem_gib),
        row.observed.graph_max_bs, row.observed.ready_avail_gib)
    # What calibration makes of it: the weights factor is the observed / guessed ratio.
    fixed, correction = learn([row.keyed], row.key, GUESS)
    assert correction.weights == pytest.approx(30.73 / 30.0)
    assert fixed.weights_gib == pytest.approx(30.73)


def test_observations_come_newest_first_up_to_the_limit(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        for attempt in range(1, 21):
            ledger.attempt_started("qwen", "fp1", attempt, P, float(attempt))
            ledger.record_observation("qwen", attempt, KEY, OBS, outcome="ready", params=P,
                                      estimate=GUESS, at=float(attempt))
        assert [20, 19, 18] == [r.attempt for r in ledger.observations(limit=3)]
        assert 20 == len(ledger.observations())

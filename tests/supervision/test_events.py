"""The typed events (launcher.supervise.events): names, the log boundary's ``to_dict`` and its
inverse, and redaction that keeps the types. Pure: no I/O."""

from __future__ import annotations

import enum
import logging
import re
import typing
from collections.abc import Mapping
from dataclasses import fields
from types import NoneType, UnionType
from typing import Any

import pytest

from launcher.memory.calibration import CostGuess
from launcher.params import LaunchParams
from launcher.sglang.outcome import Confidence, Outcome
from launcher.sglang.phases import Phase
from launcher.supervise import events as ev
from launcher.untrusted import Redactor

PARAMS = LaunchParams(0.8, 32, mamba_strategy="extra_buffer", env=(("SGLANG_X", "1"),))
GUESS = CostGuess(weights_gib=30.0, kv_bytes_per_token=1024.0, graph_gib={"all": 1.5},
                  graph_bs=32, activations_gib=2.0, pre_load_free_gib=78.0)


def sample(tp: Any, name: str) -> Any:
    """A value of type ``tp`` that is not a default (so a round trip that drops it fails)."""
    origin = typing.get_origin(tp)
    if origin in (UnionType, typing.Union):
        return sample(next(a for a in typing.get_args(tp) if a is not NoneType), name)
    if origin is tuple:
        return (sample(typing.get_args(tp)[0], name),)
    if origin in (Mapping, dict):
        return {"free_gib": 2.5}
    if tp is LaunchParams:
        return PARAMS
    if tp is CostGuess:
        return GUESS
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return list(tp)[1]
    if isinstance(tp, type) and issubclass(tp, ev.HistoryEntry | ev.RankRun | ev.RankPid
                                           | ev.RankOutcome):
        hints = typing.get_type_hints(tp)
        return tp(**{f.name: sample(hints[f.name], f.name) for f in fields(tp)})
    return {bool: True, int: 7, float: 2.5, str: f"{name} text"}[tp]


def full(cls: type[ev.Event]) -> ev.Event:
    hints = typing.get_type_hints(cls)
    return cls(**{f.name: sample(hints[f.name], f.name) for f in fields(cls)})


ALL = sorted(ev.EVENTS.values(), key=lambda c: c.name)


def test_every_event_has_one_stable_dotted_name() -> None:
    subclasses = {c for c in vars(ev).values()
                  if isinstance(c, type) and issubclass(c, ev.Event) and c is not ev.Event}
    assert subclasses == set(ev.EVENTS.values())
    assert 57 == len(ev.EVENTS)
    assert all(re.fullmatch(r"[a-z]+\.[a-z_]+", name) for name in ev.EVENTS)
    assert {logging.INFO, logging.WARNING, logging.ERROR} >= {c.level for c in ALL}


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.name)
def test_to_dict_and_from_dict_are_inverses(cls: type[ev.Event]) -> None:
    event = full(cls)
    data = event.to_dict()
    assert event == ev.from_dict(cls.name, data)
    assert [f.metadata.get("key", f.name) for f in fields(cls)] == list(data)  # field order


def test_to_dict_is_the_payload_the_log_always_had() -> None:
    """Optional keys are left out while None, kept keys stay (also as None), params are
    as_dict, enums their value, tuples lists, nested records dicts, ``try`` spelled so."""
    ready = ev.ServerReady(
        attempt=3, attempts=2, seconds=None, attempt_seconds=None, adopted=True,
        params=LaunchParams(0.8, 32),
        history=(ev.HistoryEntry(params=LaunchParams(0.9, None), outcome=Outcome.OOM_KV_CACHE,
                                 phase=Phase.KV_CACHE, attempt=2),))
    assert {
        "attempt": 3, "attempts": 2, "seconds": None, "attempt_seconds": None, "adopted": True,
        "params": {"mem_fraction_static": 0.8, "cuda_graph_max_bs": 32},
        "history": [{"params": {"mem_fraction_static": 0.9, "cuda_graph_max_bs": None},
                     "outcome": "oom_kv_cache", "phase": "kv_cache", "attempt": 2}],
    } == ready.to_dict()
    assert {"error": "down", "unreachable_s": 1.5} == ev.HostLost(
        error="down", unreachable_s=1.5).to_dict()
    assert {"error": "down", "node": "b", "unreachable_s": 1.5, "retry_in_s": 2.0} == (
        ev.HostLost(error="down", node="b", unreachable_s=1.5, retry_in_s=2.0).to_dict())
    assert {"try": 2, "error": "timeout"} == ev.ListingRetry(try_=2, error="timeout").to_dict()
    assert {} == ev.AttemptEnded(
        attempt=1, params=None, outcome="stopped", phase=None, numbers={}, evidence=(),
        advice="", started_at=None, ended_at=5.0, log_tail="", tail_path=None,
    ).to_dict()["params"]
    assert {"phase": "cuda_graph", "silent_s": 20.5, "attempt": 1} == ev.StallDetected(
        phase=Phase.CUDA_GRAPH, silent_s=20.5, attempt=1).to_dict()


def test_from_dict_names_what_is_wrong() -> None:
    with pytest.raises(ValueError, match=re.escape("unknown event 'no.such'")):
        ev.from_dict("no.such", {})
    with pytest.raises(ValueError, match="ServerStopped: missing 'left_running'"):
        ev.from_dict("server.stopped", {"reason": "stop requested"})
    with pytest.raises(ValueError, match=re.escape("AttemptFailed.outcome")):
        ev.from_dict("attempt.failed", full(ev.AttemptFailed).to_dict() | {"outcome": "later"})
    with pytest.raises(ValueError, match=re.escape("ProbeFailed.consecutive")):
        ev.from_dict("probe.failed", {"consecutive": "3", "detail": "x"})


def test_redaction_masks_strings_and_keeps_the_types() -> None:
    """A secret in any string of an event (nested too) is masked; enums, tuples, params and
    numbers stay what they were, so consumers can still match on them."""
    secret = "hf_aBcDeFgHiJkLmNo"
    failed = ev.AttemptFailed(
        attempt=1, outcome=Outcome.MODEL_NOT_FOUND, confidence=Confidence.DECISIVE,
        phase=Phase.INIT, numbers={"note": f"token {secret}"}, retryable=False,
        after_ready=False, evidence=(f"401 for ?token={secret}",), advice=f"check {secret}")
    masked = Redactor([secret])(failed)
    assert isinstance(masked, ev.AttemptFailed)
    assert secret not in repr(masked)
    assert masked.outcome is Outcome.MODEL_NOT_FOUND and masked.phase is Phase.INIT
    assert ("401 for ?token=***",) == masked.evidence
    assert "check ***" == masked.advice
    assert {"note": "token ***"} == masked.numbers
    started = ev.AttemptStarted(attempt=1, params=PARAMS.with_env("HF_TOKEN", secret))
    assert (("HF_TOKEN", "***"), ("SGLANG_X", "1")) == Redactor([secret])(started).params.env

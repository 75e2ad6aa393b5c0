"""launcher.sglang.multinode: the joined line and consequence vs cause, on SGLang's own texts.

The lines are SGLang's (``utils/common.py`` f-strings, identical in 0.5.10 and 0.5.23) and
torch/gloo's as logged in tests/data/logs/v056_root_cause_tp3.log (a TP rank whose barrier
failed with "Connection closed by peer" after another rank's OOM: the consequence).
"""

from __future__ import annotations

from pathlib import Path

from launcher.sglang.classify import diagnose_text
from launcher.sglang.multinode import is_consequence, is_joined_line, pick_cause
from launcher.sglang.outcome import Diagnosis, Outcome
from launcher.sglang.phases import Phase

LOGS = Path(__file__).parents[1] / "data" / "logs"
GLOO = next(line for line in (LOGS / "v056_root_cause_tp3.log").read_text().splitlines()
            if "Connection closed by peer" in line)


def diag(outcome: Outcome, *evidence: str) -> Diagnosis:
    return Diagnosis(outcome=outcome, phase=Phase.CUDA_GRAPH, evidence=list(evidence))


def test_joined_line() -> None:
    assert is_joined_line("[2026-12-01 18:15:55] Dummy health check server started in "
                          "background thread at 10.0.4.22:30000")
    assert is_joined_line("[2026-12-01 18:15:55] Dummy health check server started in "
                          "background thread at [fd00::7]:30000")
    assert not is_joined_line("[2026-12-01 18:15:55] Dummy health check server stopped at "
                              "10.0.4.22:30000")
    assert not is_joined_line("Dummy health check server failed to start: [Errno 98]")


def test_gloo_peer_closed_is_a_consequence_unless_the_rank_failed_on_its_own() -> None:
    assert GLOO.startswith("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc")
    assert is_consequence(diag(Outcome.NCCL_ERROR, GLOO), [])
    assert is_consequence(diag(Outcome.OTHER), ["noise", GLOO])
    wrapped = ("Exception: Capture cuda graph failed: [../third_party/gloo/gloo/transport/tcp/"
               "pair.cc:534] Connection closed by peer [10.0.4.21]:5000")
    assert is_consequence(diag(Outcome.NCCL_ERROR, wrapped), [])
    watchdog = ("[Rank 9] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, "
                "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600050 "
                "milliseconds before timing out.")
    assert is_consequence(diag(Outcome.NCCL_ERROR, watchdog), [])
    # Its own OOM (or bad argument) is a cause, whatever else the log shows.
    assert not is_consequence(diag(Outcome.OOM_GRAPH_CAPTURE, GLOO), [GLOO])
    assert not is_consequence(diag(Outcome.BAD_ARGUMENT), [GLOO])
    # Killed from outside, no peer error: a cause.
    assert not is_consequence(diag(Outcome.KILLED), ["[2026-12-01] Load weight end."])


def test_the_real_root_cause_log_is_an_oom_not_a_consequence() -> None:
    """The log holds TP3's OOM in the KV pool (the root cause, as its traceback shows) and
    TP0's gloo "Connection closed by peer" after it: read as one rank's log it is a cause."""
    text = (LOGS / "v056_root_cause_tp3.log").read_text()
    verdict = diagnose_text(text, 137)
    assert Outcome.OOM_KV_CACHE == verdict.outcome
    assert GLOO in text
    assert not is_consequence(verdict, text.splitlines())


def test_pick_cause_prefers_the_first_own_failure() -> None:
    consequence = diag(Outcome.NCCL_ERROR, GLOO)
    oom = diag(Outcome.OOM_GRAPH_CAPTURE)
    assert 1 == pick_cause([(0, consequence, True), (1, oom, False)])
    assert 0 == pick_cause([(1, oom, False), (0, consequence, True)])
    assert 0 == pick_cause([(0, consequence, True), (2, consequence, True)])

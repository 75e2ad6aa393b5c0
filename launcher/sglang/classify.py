"""What an attempt came to, judged from its log and exit status.

``classify(lines, exit_status)`` reads a whole log; ``diagnose(follower, exit_status)`` judges
what a ``LogFollower`` has already read (the supervisor's case: the follower saw every line,
so nothing needs re-reading). Both are pure.

How the verdict is reached, in order:

1. "address already in use" anywhere -> port_in_use, even when a readiness line follows: a
   warmup thread can reach *another* server on the same port and print "fired up".
2. The failure records since the last readiness line (failures before it did not stop the
   server): tracebacks, and failure lines outside tracebacks. Each is judged alone. The root
   cause is the first *specific* one (an OOM, a config error, a CUDA error...). Failures that
   are usually a consequence of another rank dying (NCCL errors, unknown exceptions) count
   only when nothing specific was printed. The parent's follow-on lines ("Received sigquit
   from a child process", "Rank 0 scheduler is dead", kill_process_tree) are never the cause;
   neither are a shell's "Killed" or exit 137 after a traceback (SGLang kills its own tree).
3. ``hung`` (the caller saw no progress for too long) -> hang.
4. Follow-on lines and no cause: a child that died by SIGKILL (exit code -9, usually the OOM
   killer) -> killed; a child that died otherwise -> other.
5. No failure at all: exit 137/-9 or 143/-15 or a shell's "Killed" -> killed; a readiness
   line -> ready; exit 2 (argparse) -> bad_argument; 255 (ssh lost the exit status) or no
   status -> incomplete; any other status -> other.

An OOM's kind follows the phase of the rank that raised it: before "Load weight end" the
weights do not fit; then the KV pool; then graph capture; from warmup on it is a runtime OOM.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from launcher.sglang import evidence as ev
from launcher.sglang.logparse import (
    FailureSignature,
    LogFollower,
    Signature,
    Traceback,
    fill_error_figures,
    is_routine,
    split_records,
)
from launcher.sglang.outcome import Confidence, Diagnosis, Outcome
from launcher.sglang.phases import Phase
from launcher.sglang.prescribe import prescription

__all__ = ["ADVICE", "RETRYABLE", "classify", "diagnose", "diagnose_text"]

ADVICE: dict[Outcome, str] = {
    Outcome.READY: "the server is up",
    Outcome.OOM_GRAPH_CAPTURE: (
        "CUDA-graph capture ran out of GPU memory: lower --mem-fraction-static (by 0.05-0.1) "
        "and/or the CUDA-graph max batch size, or disable CUDA graphs"
    ),
    Outcome.OOM_WEIGHTS: (
        "the weights do not fit: use more GPUs (tp) or a quantized model; "
        "mem-fraction will not help"
    ),
    Outcome.OOM_KV_CACHE: (
        "the GPU ran out of memory while allocating the KV cache: lower --mem-fraction-static"
    ),
    Outcome.OOM_RUNTIME: (
        "the GPU ran out of memory at warmup or while serving: lower --mem-fraction-static "
        "or --chunked-prefill-size"
    ),
    Outcome.KV_TOO_SMALL: (
        "the weights leave no room for the KV cache: raise --mem-fraction-static "
        "(above the minimum SGLang states, if it states one), or use more GPUs"
    ),
    Outcome.HYBRID_STATE_TOO_SMALL: (
        "the hybrid (Mamba/linear-attention) state cache does not fit: raise "
        "--mem-fraction-static, or set a larger --max-mamba-cache-size / "
        "--mamba-full-memory-ratio (SGLang's message also suggests a lower "
        "--max-running-requests, but on 0.5.23 the state cache's size does not depend on it)"
    ),
    Outcome.PORT_IN_USE: (
        "a port is taken (HTTP, an internal port or torch distributed): stop what holds it "
        "or choose another --port; relaunching unchanged fails again"
    ),
    Outcome.BAD_ARGUMENT: (
        "SGLang rejected the command line or the configuration: fix the flags (spellings "
        "differ between SGLang versions); relaunching unchanged fails again"
    ),
    Outcome.MODEL_NOT_FOUND: (
        "the model cannot be found from the host: check --model-path, that the directory "
        "holds config.json, and Hugging Face access or cache (HF_HUB_OFFLINE)"
    ),
    Outcome.NCCL_ERROR: (
        "NCCL failed between ranks: relaunch once; if it repeats, check the interconnect, "
        "NCCL_* settings and leftover processes on the GPUs"
    ),
    Outcome.HANG: "the server stopped making progress: kill its whole process tree and relaunch",
    Outcome.KILLED: (
        "killed by SIGKILL with no error of its own (host OOM killer, an operator, a "
        "timeout): check `dmesg -T | grep -i oom` and host RAM, then relaunch"
    ),
    Outcome.CUDA_ERROR_OTHER: (
        "a CUDA error that is not about memory (no kernel for this GPU, illegal access, "
        "driver): check the GPU, driver and CUDA build; memory settings will not help"
    ),
    Outcome.OTHER: "failed with an error launcher does not know: read the evidence and the log",
    Outcome.INCOMPLETE: (
        "the log ends with no error and no readiness line: the server may still be "
        "starting, or its output was cut"
    ),
}

# Advice for failures whose outcome is too broad to say what to do.
_SPECIAL_ADVICE: dict[Signature, str] = {
    Signature.HOST_OOM: (
        "the host ran out of RAM ([Errno 12]), not the GPU: free host memory; GPU memory "
        "settings will not help"
    ),
    Signature.GPU_BUSY: (
        "one GPU has less free memory than the others: another process (often a leftover "
        "sglang::scheduler) holds it; free that GPU before relaunching"
    ),
    Signature.WARMUP_FAILED: (
        "the warmup request failed: export no_proxy=127.0.0.1,localhost (warmup honours "
        "http_proxy) and check --host/--port"
    ),
}

RETRYABLE = frozenset(
    {
        Outcome.OOM_GRAPH_CAPTURE,
        Outcome.OOM_KV_CACHE,
        Outcome.OOM_RUNTIME,
        Outcome.KV_TOO_SMALL,
        Outcome.HYBRID_STATE_TOO_SMALL,
        Outcome.HANG,
        Outcome.KILLED,
        Outcome.NCCL_ERROR,  # once: the backoff policy limits repeats
        Outcome.INCOMPLETE,
    }
)

KILLED_STATUSES = frozenset({137, -9, 143, -15})  # SIGKILL / SIGTERM, shell or Popen style
_LOST_STATUS = 255  # ssh without a waiting shell reports a killed command this way
_ARGPARSE_STATUS = 2
_SIGNAL_NAMES = {9: "SIGKILL", 15: "SIGTERM"}
_MAX_EVIDENCE = 6

_OOM_BY_PHASE = {
    Phase.INIT: Outcome.OOM_WEIGHTS,
    Phase.WEIGHTS: Outcome.OOM_WEIGHTS,
    Phase.KV_CACHE: Outcome.OOM_KV_CACHE,
    Phase.CUDA_GRAPH: Outcome.OOM_GRAPH_CAPTURE,
    Phase.WARMUP: Outcome.OOM_RUNTIME,
    Phase.READY: Outcome.OOM_RUNTIME,
}
# Where a start-up traceback's deepest frames are tells its phase when the rank printed no
# phase line of its own (searched from the deepest frame up).
_FRAME_PHASES = (
    (Phase.CUDA_GRAPH, re.compile(r"graph_runner|cuda_graph_setup|init_device_graphs|in capture")),
    (Phase.KV_CACHE, re.compile(r"memory_pool|kv_cache_configurator|pool_configurator")),
    (Phase.WEIGHTS, re.compile(r"model_loader|weight_utils|in load_model|in load_weights")),
)
_CHILD_EXIT = re.compile(r"(?i)exit code:? \(?(-?\d+)")


@dataclass(frozen=True)
class _Record:
    """One failure as printed: a traceback, or the signatures of one line outside one."""

    line_no: int
    rank: str | None
    phase: Phase | None
    signatures: frozenset[Signature]
    evidence: tuple[str, ...]
    text: str  # what it says, without source-code frames
    frames: tuple[str, ...] = ()
    exc_type: str | None = None


@dataclass(frozen=True)
class _Verdict:
    outcome: Outcome
    phase: Phase | None
    specific: bool  # False: often a consequence of another rank's failure
    special: Signature | None = None  # picks advice from _SPECIAL_ADVICE
    confidence: Confidence = Confidence.DECISIVE
    remark: str = ""


def _records(failures: Sequence[Traceback | FailureSignature]) -> list[_Record]:
    records: list[_Record] = []
    by_line: dict[int, list[FailureSignature]] = {}
    for item in failures:
        if isinstance(item, Traceback):
            records.append(
                _Record(
                    line_no=item.line_no,
                    rank=item.rank,
                    phase=item.phase,
                    signatures=item.signatures,
                    evidence=tuple(item.evidence),
                    text=item.text,
                    frames=item.frames,
                    exc_type=item.exc_type,
                )
            )
        else:
            by_line.setdefault(item.line_no, []).append(item)
    for line_no, sigs in by_line.items():
        first = sigs[0]
        records.append(
            _Record(
                line_no=line_no,
                rank=first.rank,
                phase=first.phase,
                signatures=frozenset(s.kind for s in sigs),
                evidence=(first.line,),
                text=first.line,
            )
        )
    records.sort(key=lambda r: r.line_no)
    return records


def _frame_phase(frames: tuple[str, ...]) -> Phase | None:
    for frame in reversed(frames):
        for phase, pattern in _FRAME_PHASES:
            if pattern.search(frame):
                return phase
    return None


def _oom_phase(rec: _Record, hints: ev.Hints) -> tuple[Phase | None, Confidence, str]:
    """The phase an OOM happened in, how firmly the log shows it, and a remark when the
    traceback and the phase lines disagree.

    The rank's phase lines, moved forward (never back) by what the traceback says: a "Capture
    cuda graph failed" wrapper, its outermost telling frame (``evidence.frame_phase``; serving
    frames mean a runtime OOM) or its deepest frames. Frames win over the absence of phase
    lines; a record without frames (a pasted excerpt) borrows the frames of the log tail.
    With neither phase lines nor frames the phase is a guess: weak.
    """
    phase = rec.phase
    if phase is not None and phase.order >= Phase.WARMUP.order:
        return phase, Confidence.DECISIVE, ""
    hint = Phase.CUDA_GRAPH if Signature.GRAPH_CAPTURE_FAILED in rec.signatures else None
    if rec.frames:
        hint = hint or ev.frame_phase(rec.frames) or _frame_phase(rec.frames)
    else:
        hint = hint or hints.frame_phase
    if hint is None:
        return phase, Confidence.DECISIVE if phase is not None else Confidence.WEAK, ""
    if phase is None or hint.order > phase.order:
        return hint, Confidence.DECISIVE, ""
    remark = (
        f"traceback frames point to {hint.value}, the phase lines to {phase.value}; "
        f"going by the phase lines"
        if hint is not phase
        else ""
    )
    return phase, Confidence.DECISIVE, remark


def _judge(rec: _Record, hints: ev.Hints) -> _Verdict | None:
    """The verdict one failure record would give alone; None for a follow-on record."""
    sigs, phase = rec.signatures, rec.phase
    if rec.frames and rec.exc_type is None and not sigs:
        return None  # a traceback cut before its exception (a paste, a parent's raise) says nothing
    if Signature.PORT_IN_USE in sigs:
        return _Verdict(Outcome.PORT_IN_USE, phase, True)
    if Signature.KV_TOO_SMALL in sigs:  # raised while sizing the pools, after the weights
        return _Verdict(Outcome.KV_TOO_SMALL, phase or Phase.KV_CACHE, True)
    if Signature.HYBRID_STATE in sigs:
        return _Verdict(Outcome.HYBRID_STATE_TOO_SMALL, phase or Phase.KV_CACHE, True)
    if Signature.CUDA_OOM in sigs or Signature.NCCL_OOM in sigs:
        oom_phase, confidence, remark = _oom_phase(rec, hints)
        outcome = _OOM_BY_PHASE[oom_phase or Phase.INIT]
        return _Verdict(outcome, oom_phase, True, confidence=confidence, remark=remark)
    for sig, outcome in (
        (Signature.HOST_OOM, Outcome.OTHER),
        (Signature.MODEL_NOT_FOUND, Outcome.MODEL_NOT_FOUND),
        (Signature.BAD_ARGUMENT, Outcome.BAD_ARGUMENT),
        (Signature.GPU_BUSY, Outcome.OTHER),
        (Signature.CUDA_ERROR, Outcome.CUDA_ERROR_OTHER),
        (Signature.WATCHDOG_TIMEOUT, Outcome.HANG),
        (Signature.HEALTH_CHECK_FAILED, Outcome.HANG),
    ):
        if sig in sigs:
            special = sig if sig in _SPECIAL_ADVICE else None
            return _Verdict(outcome, phase, True, special)
    if Signature.NCCL_ERROR in sigs:
        # Wrapped by "Capture cuda graph failed: [...gloo...] Connection closed by peer": the
        # capture failed because a peer went, which is the cause here, not a consequence.
        wrapped = Signature.GRAPH_CAPTURE_FAILED in sigs
        return _Verdict(Outcome.NCCL_ERROR, Phase.CUDA_GRAPH if wrapped else phase, wrapped)
    if Signature.CHILD_FAILED in sigs or Signature.KILLED in sigs:
        return None
    if rec.exc_type == "EOFError":  # 0.5.6 parent: a scheduler's pipe closed as it died
        return None
    if Signature.GRAPH_CAPTURE_FAILED in sigs:  # wrapping an error that is not memory
        return _Verdict(Outcome.OTHER, Phase.CUDA_GRAPH, True)
    if ev.rejects_arguments(rec.exc_type, rec.text, rec.frames):
        return _Verdict(Outcome.BAD_ARGUMENT, phase, True)  # SGLang's validation, or names a flag
    special = Signature.WARMUP_FAILED if Signature.WARMUP_FAILED in sigs else None
    return _Verdict(Outcome.OTHER, phase, False, special)


def _refined_phase(phase: Phase | None, rec: _Record, hints: ev.Hints) -> Phase | None:
    """A non-memory failure's phase: the rank's phase lines, else its traceback's frames (or
    the tail's), else serving when the tail shows a serving server."""
    if phase is not None and phase is not Phase.INIT:
        return phase
    if hints.legacy_phase is not None:  # phase lines of SGLang before 0.3
        return hints.legacy_phase
    framed = ev.frame_phase(rec.frames) if rec.frames else hints.frame_phase
    if framed is not None:
        return framed
    return Phase.READY if phase is None and hints.serving else phase


def _tail_evidence(follower: LogFollower, n: int = 3) -> list[str]:
    lines = [line for line in follower.last_lines if line.strip()]
    return lines[-n:]


def _kill_evidence(follower: LogFollower, exit_status: int | None) -> list[str]:
    """Evidence for a kill that the log does not record: the tail without routine traffic
    (access lines, batch statistics: a serving server's last lines say nothing of its end),
    then a line saying what happened, so that whoever shows the last line as "the error"
    shows the kill and not ``GET /health 200 OK``."""
    lines = [line for line in follower.last_lines if line.strip() and not is_routine(line)]
    signal = abs(exit_status) % 128 if exit_status is not None else None
    name = _SIGNAL_NAMES.get(signal) if signal is not None else None
    what = f"killed by signal {signal} ({name})" if name else "killed"
    return [*lines[-2:], f"{what}; no error in the log"]


def _diagnosis(
    outcome: Outcome,
    phase: Phase | None,
    follower: LogFollower,
    exit_status: int | None,
    *,
    evidence: Iterable[str],
    rank: str | None = None,
    special: Signature | None = None,
    error_text: str | None = None,
    confidence: Confidence = Confidence.DECISIVE,
    remarks: Iterable[str] = (),
    sglang_version: str | None = None,
) -> Diagnosis:
    numbers = dataclasses.replace(follower.numbers)
    if error_text is not None:
        fill_error_figures(numbers, error_text, overwrite=True)
    advice = _SPECIAL_ADVICE[special] if special is not None else ADVICE[outcome]
    if outcome is Outcome.KV_TOO_SMALL and numbers.min_mem_fraction is not None:
        advice += f"; SGLang states the minimum viable value is {numbers.min_mem_fraction}"
    fix = prescription(numbers, sglang_version) if sglang_version is not None else None
    prescribed = None
    if fix is not None:
        snippet = fix.toml()
        advice += (f". SGLang's error prescribes its fix; for SGLang {sglang_version} that is "
                   f"{fix.describe()}. Config change:\n{snippet}")
        prescribed = {"description": fix.describe(), "flags": fix.flags, "env": dict(fix.env),
                      "toml": snippet}
    return Diagnosis(
        outcome=outcome,
        phase=phase or Phase.INIT,
        numbers=numbers,
        evidence=list(dict.fromkeys(evidence))[:_MAX_EVIDENCE],  # the same text once
        # A weak oom_weights (phase unknown) may be a serving OOM: worth a lower retry. A
        # prescribed fix makes a relaunch worth asking the policy about (it applies the fix
        # with [policy] apply_prescribed_fixes, else gives up naming it).
        retryable=outcome in RETRYABLE
        or (outcome is Outcome.OOM_WEIGHTS and confidence is Confidence.WEAK)
        or fix is not None,
        advice=advice,
        rank=rank,
        exit_status=exit_status,
        confidence=confidence,
        remarks=[r for r in remarks if r],
        prescribed_fix=prescribed,
    )


def diagnose(
    follower: LogFollower,
    exit_status: int | None = None,
    *,
    hung: bool = False,
    sglang_version: str | None = None,
) -> Diagnosis:
    """The verdict on the log ``follower`` has read, given the exit status if the process
    ended (None: still running or unknown) and whether the caller judged it ``hung``.

    With the server's ``sglang_version``, a fix SGLang's error prescribes is put in the
    advice (and ``prescribed_fix``) in that version's dialect, as a config snippet.

    Does not change the follower, so it can be asked mid-stream.
    """

    hints = ev.scan(follower.last_lines)

    def verdict(
        outcome: Outcome,
        evidence: Iterable[str],
        *,
        phase: Phase | None = None,
        confidence: Confidence = Confidence.DECISIVE,
    ) -> Diagnosis:
        return _diagnosis(
            outcome,
            phase or ev.later(follower.phase, hints.legacy_phase),
            follower,
            exit_status,
            evidence=evidence,
            confidence=confidence,
        )

    port = follower.port_in_use
    if port is not None:
        return _diagnosis(
            Outcome.PORT_IN_USE,
            port.phase,
            follower,
            exit_status,
            evidence=[port.line],
            rank=port.rank,
        )
    records = _records(follower.failures())
    judged = [(rec, _judge(rec, hints)) for rec in records]
    root = next(((r, v) for r, v in judged if v is not None and v.specific), None)
    # Texts logparse does not know (gated repo, an old "Not enough memory", a segfault...)
    # outrank vague records: those are usually another rank's consequence.
    fallback = ev.fallback(hints) if root is None else None
    if fallback is not None:
        return verdict(
            fallback.outcome,
            [fallback.line],
            phase=fallback.phase,
            confidence=fallback.confidence,
        )
    root = root or next(((r, v) for r, v in judged if v is not None), None)
    if root is not None:
        rec, v = root
        return _diagnosis(
            v.outcome,
            v.phase if v.outcome.is_memory else _refined_phase(v.phase, rec, hints),
            follower,
            exit_status,
            evidence=rec.evidence,
            rank=rec.rank,
            special=v.special,
            error_text=rec.text,
            confidence=v.confidence,
            remarks=[v.remark],
            sglang_version=sglang_version,
        )
    if hung:
        return verdict(Outcome.HANG, _tail_evidence(follower))
    # Follow-on records: a parent reporting a dead child (a shell's "Killed" is not one).
    follow_ons = [r for r, v in judged if v is None and Signature.KILLED not in r.signatures]
    if follow_ons:
        codes = {int(c) for r in follow_ons for c in _CHILD_EXIT.findall(r.text)}
        outcome = Outcome.KILLED if -9 in codes or hints.child_sigkill else Outcome.OTHER
        phase = follower.phase
        if phase is None or phase is Phase.INIT:
            phase = hints.frame_phase or phase
        return verdict(outcome, [line for r in follow_ons for line in r.evidence], phase=phase)
    killed_lines = [r.evidence[0] for r in records if Signature.KILLED in r.signatures]
    if killed_lines or exit_status in KILLED_STATUSES:
        return verdict(Outcome.KILLED, killed_lines or _kill_evidence(follower, exit_status))
    if follower.ready_line is not None:
        return verdict(Outcome.READY, [follower.ready_line])
    if hints.serving and exit_status is None:  # an excerpt from a server that was serving
        return verdict(
            Outcome.READY, _tail_evidence(follower), phase=Phase.READY, confidence=Confidence.WEAK
        )
    if exit_status == _ARGPARSE_STATUS:
        return verdict(Outcome.BAD_ARGUMENT, _tail_evidence(follower))
    if exit_status is None or exit_status == _LOST_STATUS:
        return verdict(Outcome.INCOMPLETE, _tail_evidence(follower), confidence=Confidence.WEAK)
    return verdict(Outcome.OTHER, _tail_evidence(follower))


def _lines(items: Iterable[str]) -> Iterable[str]:
    """Lines from items that may still carry terminators or embedded ``\\r`` (tqdm)."""
    for item in items:
        if item.endswith("\n"):
            item = item[:-2] if item.endswith("\r\n") else item[:-1]
        if "\r" in item or "\n" in item:
            yield from split_records(item)
        else:
            yield item


def classify(
    lines: Iterable[str],
    exit_status: int | None = None,
    *,
    hung: bool = False,
    sglang_version: str | None = None,
) -> Diagnosis:
    """The verdict on a whole log, given as lines (see the module docstring for the rules).

    ``exit_status`` is the server's status if it ended (137/-9 for SIGKILL), None if it is
    still running or unknown; ``hung`` says the caller saw no progress for too long.
    """
    follower = LogFollower()
    for line in ev.unwrap(_lines(lines)):  # a pasted log may carry a collector's prefixes
        follower.feed_line(line)
    follower.finish()
    return diagnose(follower, exit_status, hung=hung, sglang_version=sglang_version)


def diagnose_text(
    text: str,
    exit_status: int | None = None,
    *,
    hung: bool = False,
    sglang_version: str | None = None,
) -> Diagnosis:
    """``classify`` for a log as one string, split on ``\\r`` and ``\\n`` as SGLang writes it."""
    return classify(split_records(text), exit_status, hung=hung, sglang_version=sglang_version)

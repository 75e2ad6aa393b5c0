"""Learning from the fleet, wired: the key a server's observations are filed under, the GPU
model read on its host, and its estimate corrected by the ledger's observations.

``launcher.memory.calibration`` is the pure arithmetic; this module reads the host (one nvidia-smi
query) and the ledger, for ``launcher.plan.first_attempt`` (the first attempt's choice) and
``launcher.daemon`` (the recorder's ``ObservationContext``).

Error handling: the GPU model is advice; a host that cannot tell gives "" (calibration then
uses no observation: an unknown key matches nothing), never an exception, except
HostKeyError, which must reach the supervisor.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from launcher.config.schema import HostConfig, ServerConfig
from launcher.errors import HostKeyError, LauncherError
from launcher.host.facts import Facts, read_facts
from launcher.host.transport.base import Transport
from launcher.memory.calibration import Correction, ObservationKey, learn_estimate
from launcher.memory.estimate import Estimate
from launcher.sglang.modelfacts import NoEstimate
from launcher.sglang.observed import speculative_key
from launcher.store.ledger import Ledger, ObservationContext

__all__ = [
    "NAME_QUERY", "context_of", "gpu_model", "learned", "observation_key", "parse_names",
]

NAME_QUERY = ["--query-gpu=index,name", "--format=csv,noheader"]

log = structlog.get_logger("launcher")


def parse_names(text: str) -> dict[int, str]:
    """``index, name`` lines (nvidia-smi csv, noheader) -> {index: name}; malformed lines are
    skipped (the name is advice, not a fact the launch depends on)."""
    out: dict[int, str] = {}
    for line in text.splitlines():
        index, sep, name = line.partition(",")
        if sep and index.strip().isdigit() and name.strip():
            out[int(index)] = name.strip()
    return out


async def gpu_model(transport: Transport, nvidia_smi: Sequence[str], index: int) -> str:
    """The nvidia-smi name of GPU ``index`` (e.g. "NVIDIA H100 80GB HBM3"); "" when the host
    cannot tell."""
    try:
        result = await transport.run([*nvidia_smi, *NAME_QUERY])
    except HostKeyError:
        raise
    except LauncherError as exc:
        log.info("fleet.gpu_model_unknown", host=transport.host_name, error=str(exc)[:200])
        return ""
    if not result.ok:
        return ""
    return parse_names(result.stdout.decode("utf-8", "replace")).get(index, "")


def observation_key(facts: Facts, gpu: str, version: str) -> ObservationKey:
    """The key of a server with ``facts`` on GPUs named ``gpu`` under SGLang ``version``; the
    speculative settings spelt as ``speculative_key`` spells the log's."""
    spec = facts.shape.spec
    spelt = ""
    if spec is not None:
        spelt = speculative_key({
            "speculative_algorithm": spec.algorithm, "speculative_num_steps": spec.num_steps,
            "speculative_eagle_topk": spec.topk,
            "speculative_num_draft_tokens": spec.num_draft_tokens,
        })
    return ObservationKey(facts.model.arch, gpu, version, spelt)


def learned(
    ledger: Ledger, facts: Facts, raw: Estimate, gpu: str, version: str, model_path: str
) -> tuple[Estimate, Correction, ObservationContext]:
    """``raw`` corrected by the ledger's observations of the server's key, the correction
    (its ``margin`` and basis), and the context its own attempts are filed under (with the
    uncorrected estimate: guesses are stored against the prior, see
    ``launcher.memory.calibration.guess_of``)."""
    key = observation_key(facts, gpu, version)
    rows = ledger.observations(architecture=key.architecture, gpu_model=key.gpu_model)
    corrected, correction = learn_estimate([r.keyed for r in rows], key, raw)
    context = ObservationContext(key, model=model_path, tp=facts.shape.tp, estimate=raw)
    return corrected, correction, context


async def context_of(
    transport: Transport, host: HostConfig, server: ServerConfig, version: str
) -> ObservationContext | None:
    """What ``server``'s attempts are filed under when the first attempt's choice did not read
    its facts (a warm start, or both params configured): read them now. None when they
    cannot be read (logged ``fleet.key_unknown``); HostKeyError propagates."""
    try:
        facts = await read_facts(transport, host, server, version)
        raw = facts.estimate()
    except HostKeyError:
        raise
    except (NoEstimate, LauncherError) as exc:
        log.info("fleet.key_unknown", server=server.name, error=str(exc)[:200])
        return None
    gpu = await gpu_model(transport, host.nvidia_smi, facts.gpus[0].index)
    return ObservationContext(observation_key(facts, gpu, version), model=server.model_path,
                              tp=facts.shape.tp, estimate=raw)

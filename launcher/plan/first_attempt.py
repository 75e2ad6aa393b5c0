"""The first attempt's params: the ledger's last good params, else the memory estimate, else
the configured ones. The one warm-start rule of `launcher up` (daemon) and `launcher plan`
(cli): both call :func:`warm_start`, then :func:`plan_first_attempt`.

Order (docs/memory.md):
1. the ledger's last good params for the same fingerprint (:func:`warm_start`) win;
2. else, with ``[policy] initial = "auto"`` (the default) and ``mem_fraction_static`` or
   ``cuda_graph_max_bs`` unset, or with ``initial = "estimate"``, the estimate chooses
   (:func:`launcher.memory.estimate.choose`, margin ``[policy] estimate_margin``);
3. else the configured params.

When the estimate says no setting fits, the result is ``refused``: `up` launches nothing
(:class:`~launcher.errors.WontFit`, exit 5) unless ``--force``. When no estimate can be made
(files missing, nvidia-smi unusable, host unreachable), the configured params are used and
``no_estimate`` says why.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import anyio
import structlog

from launcher.config.schema import Config, ServerConfig
from launcher.errors import RemoteCommandError, TransportError
from launcher.host.facts import Facts, GpuReadsOnce, read_facts
from launcher.host.transport import make_transport
from launcher.host.transport.base import Transport
from launcher.memory.calibration import Correction, Match, describe
from launcher.memory.estimate import Choice, Estimate, choose
from launcher.memory.priors import DEFAULT_COEFFICIENTS, Coefficients
from launcher.params import LaunchParams
from launcher.plan.fleet import gpu_model, learned
from launcher.sglang.modelfacts import NoEstimate
from launcher.sglang.versions import DEFAULT_VERSION
from launcher.store.ledger import (
    LastGood,
    Ledger,
    ObservationContext,
    fingerprint,
    ledger_path,
)

__all__ = [
    "Planned",
    "WarmStart",
    "estimate_servers",
    "plan_first_attempt",
    "wants_estimate",
    "warm_start",
]

_CONFIGURED = "configured params"


@dataclass(frozen=True)
class Planned:
    """The first attempt's params and why. ``source``: ``ledger``, ``estimate`` or
    ``configured``; ``refused``: the estimate says nothing fits (``reason`` has the numbers
    and the fix)."""

    params: LaunchParams
    reason: str
    source: str
    estimate: Estimate | None = None
    choice: Choice | None = None
    no_estimate: str | None = None
    refused: bool = False
    facts: Facts | None = None
    # Learning from the fleet (launcher.plan.fleet): the correction the ledger's observations made
    # to the estimate, and what this server's own attempts are filed under.
    correction: Correction | None = None
    observation: ObservationContext | None = None

    @property
    def memory_basis(self) -> str:
        """Which estimate the memory picture draws: the ledger-corrected one (and how it was
        corrected) or the cold one."""
        c = self.correction
        if c is None or c.match is Match.NONE:
            return ("cold estimate (the ledger has no observations of this architecture on "
                    "this GPU type)")
        return f"ledger-corrected estimate: {describe(c)}"


@dataclass(frozen=True)
class WarmStart:
    """Rule 1's answer: ``last_good``, the params that brought this launch to ready last (they
    win), or None; ``reason`` says which and why (in `up`'s words)."""

    last_good: LastGood | None
    reason: str

    @property
    def warm(self) -> tuple[LaunchParams, str] | None:
        """``plan_first_attempt``'s ``warm``: the last good params and the reason, if any."""
        return None if self.last_good is None else (self.last_good.params, self.reason)


def warm_start(ledger: Ledger | None, config: Config, server: ServerConfig,
               versions: Sequence[str], *, fresh: bool) -> WarmStart:
    """Rule 1: the newest last good params the ledger holds for this launch (its fingerprint)
    under any of ``versions`` (`up`: the version it detected; `plan`, which probes no host:
    the configured one, else every supported one). None with ``fresh``, without a ledger, or
    when the launch was never ready."""
    if fresh:
        return WarmStart(None, "fresh start requested: configured params")
    host = config.host(server.host)
    found = [] if ledger is None else [
        entry for v in versions
        if (entry := ledger.last_good_entry(fingerprint(server, host, v))) is not None]
    if not found:
        return WarmStart(None, "no last good params for this launch: configured params")
    entry = max(found, key=lambda e: e.updated_at)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(entry.updated_at))
    return WarmStart(entry, f"warm start from last good params of {when}")


def wants_estimate(mode: str, configured: LaunchParams) -> bool:
    """Whether the estimate picks (some of) the first attempt's params."""
    if mode == "configured":
        return False
    return (mode == "estimate" or configured.mem_fraction_static is None
            or configured.cuda_graph_max_bs is None)


async def plan_first_attempt(config: Config, server: ServerConfig, transport: Transport,
                             version: str, configured: LaunchParams, *,
                             warm: tuple[LaunchParams, str] | None = None,
                             configured_reason: str = _CONFIGURED,
                             always_estimate: bool = False,
                             coeffs: Coefficients = DEFAULT_COEFFICIENTS,
                             ledger: Ledger | None = None) -> Planned:
    """The first attempt of ``server``. ``warm``: the ledger's last good params and their
    reason (they win). ``always_estimate``: compute the estimate even when it chooses nothing
    (for `plan`'s picture). ``configured_reason``: why the configured params apply when the
    estimate does not choose (``WarmStart.reason``). Never raises for missing
    facts; an unreachable host is reported as ``no_estimate`` too (the supervisor deals with
    it). ``coeffs``: the costs to assume (the cold prior, or what the ledger taught).
    ``ledger``: correct the estimate by its observations of the same architecture on the same
    GPU type (``launcher.plan.fleet``; the margin is then the smaller of the configured one and
    what the observations warrant)."""
    log = structlog.get_logger("launcher").bind(server=server.name)
    policy = config.policy_for(server.name)
    mode = policy.initial
    choosing = warm is None and wants_estimate(mode, configured)
    # Both params configured: the estimate chooses nothing, but still refuses a server that no
    # setting can fit (weights alone beyond the GPUs), which would load its weights and fail.
    # initial = "configured" opts out of the estimate altogether.
    checking = warm is None and mode != "configured"
    if not (choosing or checking or always_estimate):
        if warm is not None:
            return Planned(warm[0], warm[1], "ledger")
        return Planned(configured, configured_reason, "configured")
    facts: Facts | None = None
    try:
        facts = await read_facts(transport, config.host(server.host), server, version,
                                 configured)
        est = facts.estimate(coeffs)
    except (NoEstimate, TransportError, RemoteCommandError,
            ValueError, OverflowError, TypeError) as exc:
        # The last three: the model's files (config.json, the index) said something no
        # estimate can use; this server goes without one, the others are not concerned
        # (docs/security.md, finding M3).
        if isinstance(exc, NoEstimate):
            why = str(exc)
        elif isinstance(exc, (TransportError, RemoteCommandError)):
            why = f"no estimate: {str(exc)[:200]}"
        else:
            why = (f"no estimate: {server.model_path}'s files hold a value out of range "
                   f"({type(exc).__name__}: {str(exc)[:200]})")
        log.info("estimate.unavailable", why=why)
        if warm is not None:
            return Planned(warm[0], warm[1], "ledger", no_estimate=why)
        return Planned(configured, f"{configured_reason} ({why})", "configured",
                       no_estimate=why)
    margin, correction, observation = policy.estimate_margin, None, None
    if ledger is not None:
        gpu = await gpu_model(transport, config.host(server.host).nvidia_smi,
                              facts.gpus[0].index)
        est, correction, observation = learned(ledger, facts, est, gpu, version,
                                               server.model_path)
        if correction.match is not Match.NONE:
            margin = min(margin, correction.margin)
    # With warm params (plan's picture of a warm start) the budget shown is theirs.
    choice = choose(est, configured if warm is None else warm[0], margin=margin,
                    override=mode == "estimate" and warm is None)
    if correction is not None and correction.match is not Match.NONE:
        choice = replace(choice, reason=f"{choice.reason}; {describe(correction)}")

    def learnt(planned: Planned) -> Planned:
        return replace(planned, correction=correction, observation=observation)

    if warm is not None:
        return learnt(Planned(warm[0], warm[1], "ledger", est, choice, facts=facts))
    if not choice.feasible and mode != "configured":
        # Refuse only what no wait can fix: with the GPUs empty, does a setting fit? If so,
        # the preflight waits for the other processes as it always did. Configured params
        # are the operator's: they get no margin, only what must fit at all.
        empty = replace(facts, gpus=[replace(g, other_used_gib=0.0) for g in facts.gpus])
        if choosing and not any(g.other_used_gib > 0 for g in facts.gpus):
            fits_empty = False
        else:
            fits_empty = choose(
                empty.estimate(coeffs), configured,
                margin=policy.estimate_margin if choosing else 0.0,
                override=mode == "estimate").feasible
        if not fits_empty:
            return learnt(Planned(configured, choice.reason, "estimate", est, choice,
                                  refused=True, facts=facts))
        if choosing:
            why = ("configured params (the estimate fits only once other processes free "
                   f"their GPU memory: {choice.reason})")
            return learnt(Planned(configured, why, "configured", est, choice, facts=facts))
    if not choosing:  # [policy] initial = "configured", or both params set
        why = choice.reason  # it starts "configured ... kept", unless nothing fits
        if not choice.feasible:
            why = f"configured params kept ({why})"
        if configured_reason != _CONFIGURED:
            why = f"{configured_reason}; {why}"
        return learnt(Planned(configured, why, "configured", est, choice, facts=facts))
    return learnt(Planned(choice.params, choice.reason, "estimate", est, choice, facts=facts))


async def estimate_servers(config: Config, servers: list[ServerConfig], *,
                           warm: Mapping[str, tuple[LaunchParams, str]] | None = None,
                           timeout: float = 30.0) -> dict[str, Planned]:
    """`plan`'s view: each server's first attempt with its estimate (always computed), reading
    the facts on its host; at most ``timeout`` seconds per server. The version is the configured
    one or the default (plan does not probe hosts for it). When the state dir holds a ledger,
    its observations correct the estimate as they do for `up` (``Planned.correction`` says how;
    the choice's reason ends with it), so the picture is the one `up` would act on. ``warm``:
    per server, the ledger's last good params and why, which the next `up` starts with (they
    win, as in `up`)."""
    transports = {s.host: make_transport(config.host(s.host)) for s in servers}
    # one nvidia-smi query per host, not per server (the GPUs do not change meanwhile)
    reads = {h: GpuReadsOnce(t, config.host(h).nvidia_smi) for h, t in transports.items()}
    out: dict[str, Planned] = {}
    path = ledger_path(config.state_dir)
    ledger = Ledger(path) if path.exists() else None
    try:
        for s in servers:
            configured = s.launch_params()
            with anyio.move_on_after(timeout):
                out[s.name] = await plan_first_attempt(
                    config, s, reads[s.host], s.sglang_version or DEFAULT_VERSION,
                    configured, warm=(warm or {}).get(s.name), always_estimate=True,
                    ledger=ledger)
            if s.name not in out:
                why = f"no estimate: {s.host} did not answer within {timeout:.0f} s"
                out[s.name] = Planned(configured, f"configured params ({why})", "configured",
                                      no_estimate=why)
    finally:
        with anyio.CancelScope(shield=True):
            for t in transports.values():
                await t.aclose()
        if ledger is not None:
            ledger.close()
    return out

"""Every supervision event, typed: one frozen dataclass per stable dotted name.

Producers (``lifecycle`` through its ``Emit`` action, ``supervisor``, ``ranks``, ``router``)
build these; consumers (``notify``, the ledger's ``store.LedgerRecorder``, ``metrics``, the
router's ``Registrar``) receive them through a :class:`Hook` and dispatch on their type.
``Event.to_dict`` is the one conversion to plain data, at the log boundary (the JSON lines,
and what a consumer keeps as JSON): its keys and values are the events' documented payloads.

Contract of ``to_dict``: fields in declaration order, keyed by field name (``key`` metadata
renames one, as ``try`` is a Python keyword); a field with ``_OPTIONAL`` metadata is left out
while None; ``LaunchParams`` become ``LaunchParams.as_dict()`` (``{}`` for None where a
field says so), enums their value, tuples lists, nested records dicts. :func:`from_dict` is
its inverse (tests and tools that read the JSON log).
"""

from __future__ import annotations

import enum
import logging
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from types import NoneType, UnionType
from typing import Any, ClassVar, Protocol, Self

from launcher.memory.calibration import CostGuess
from launcher.params import LaunchParams
from launcher.sglang.outcome import Confidence, Outcome
from launcher.sglang.phases import Phase

__all__ = [
    "EVENTS",
    "AttemptCorrupt",
    "AttemptEnded",
    "AttemptFailed",
    "AttemptStarted",
    "AttemptTailUnreadable",
    "Event",
    "FollowFailed",
    "GateFailed",
    "GateRetry",
    "GpuWaiting",
    "HistoryEntry",
    "Hook",
    "HostLost",
    "HostReachable",
    "LaunchFailed",
    "LeaseAcquired",
    "LeaseEnded",
    "LeaseStandby",
    "ListingFailed",
    "ListingRetry",
    "PhaseEntered",
    "PolicyDecided",
    "PortWaiting",
    "PreflightRetry",
    "ProbeFailed",
    "Probed",
    "ProcessDied",
    "ProcessStopFailed",
    "ProcessStopped",
    "RankCause",
    "RankExited",
    "RankJoined",
    "RankOutcome",
    "RankPid",
    "RankRun",
    "RankStalled",
    "RanksGateOpened",
    "RanksLaunched",
    "RanksLeftovers",
    "RestartScheduled",
    "RouterAdopted",
    "RouterDied",
    "RouterFollowFailed",
    "RouterGaveUp",
    "RouterInternalError",
    "RouterLaunchFailed",
    "RouterLaunched",
    "RouterListingFailed",
    "RouterReady",
    "RouterRegistrationFailed",
    "RouterRestartScheduled",
    "RouterStopFailed",
    "RouterUnhealthy",
    "RouterWorkerDeregistered",
    "RouterWorkerRegistered",
    "ServerAdopted",
    "ServerGaveUp",
    "ServerInternalError",
    "ServerReady",
    "ServerStopped",
    "ServerUnhealthy",
    "ServerUnknown",
    "StallDetected",
    "from_dict",
]

_OMIT = "omit_none"  # metadata: leave the key out of to_dict while the value is None
_EMPTY = "empty_if_none"  # metadata: a None LaunchParams is ``{}`` (no params known)


# Field metadata: left out of to_dict while None (such a field defaults to None); a None
# LaunchParams that is ``{}`` (no params known); ``try`` (a Python keyword) as the key.
_OPTIONAL = {_OMIT: True}
_EMPTY_PARAMS = {_EMPTY: True}
_TRY_KEY = {"key": "try"}


def _plain(value: Any) -> Any:
    if isinstance(value, LaunchParams):
        return value.as_dict()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, CostGuess):
        return value.as_dict()
    if isinstance(value, _Record):
        return value.to_dict()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


@dataclass(frozen=True, kw_only=True)
class _Record:
    """A frozen record with a plain-data form (see the module's ``to_dict`` contract)."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.metadata.get(_OMIT):
                continue
            if value is None and f.metadata.get(_EMPTY):
                out[f.metadata.get("key", f.name)] = {}
                continue
            out[f.metadata.get("key", f.name)] = _plain(value)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """The record ``to_dict`` gave ``data``; missing optional keys are None. Raises
        ValueError naming the key for a missing required key or a value of the wrong type."""
        hints = typing.get_type_hints(cls)
        kw: dict[str, Any] = {}
        for f in fields(cls):
            key = f.metadata.get("key", f.name)
            if key not in data:
                if f.default is MISSING and f.default_factory is MISSING:
                    raise ValueError(f"{cls.__name__}: missing {key!r}")
                continue
            try:
                kw[f.name] = _parse(hints[f.name], data[key], f.metadata.get(_EMPTY, False))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{cls.__name__}.{key}: {exc}") from None
        return cls(**kw)


def _parse(tp: Any, value: Any, empty_is_none: bool = False) -> Any:
    """``value`` (plain data) as type ``tp`` (the inverse of ``_plain``)."""
    origin = typing.get_origin(tp)
    if origin in (UnionType, typing.Union):
        args = typing.get_args(tp)
        if value is None and NoneType in args:
            return None
        if empty_is_none and value == {}:
            return None
        errors = []
        for arg in args:
            if arg is NoneType:
                continue
            try:
                return _parse(arg, value)
            except (TypeError, ValueError) as exc:
                errors.append(str(exc))
        raise ValueError("; ".join(errors) or f"{value!r} is not {tp}")
    if tp is Any or tp is object:
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ValueError(f"{value!r} is not a list")
        (item, _) = typing.get_args(tp)
        return tuple(_parse(item, v) for v in value)
    if origin in (Mapping, dict):
        if not isinstance(value, Mapping):
            raise ValueError(f"{value!r} is not a mapping")
        return dict(value)
    if tp is LaunchParams:
        if not isinstance(value, Mapping):
            raise ValueError(f"{value!r} is not params")
        mfs, bs = value.get("mem_fraction_static"), value.get("cuda_graph_max_bs")
        return LaunchParams.from_extras(None if mfs is None else float(mfs),
                                        None if bs is None else int(bs), dict(value))
    if tp is CostGuess:
        guess = CostGuess.from_dict(value) if isinstance(value, Mapping) else None
        if guess is None:
            raise ValueError(f"{value!r} is not a cost guess")
        return guess
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(value)
    if isinstance(tp, type) and issubclass(tp, _Record):
        if not isinstance(value, Mapping):
            raise ValueError(f"{value!r} is not a mapping")
        return tp.from_dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{value!r} is not a bool")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{value!r} is not an int")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{value!r} is not a number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"{value!r} is not a string")
        return value
    raise TypeError(f"cannot read {tp}")  # pragma: no cover (a field of an unknown type)


@dataclass(frozen=True, kw_only=True)
class Event(_Record):
    """One supervision event: ``name`` is its stable dotted name (log lines, ledger, docs);
    ``level`` the stdlib level it is logged at: warning or error for the events a person
    should look at (a failed attempt is a warning, a server that gave up an error), info for
    the rest. Under journald the level is the line's priority."""

    name: ClassVar[str]
    level: ClassVar[int] = logging.INFO


class Hook(Protocol):
    """Receives every event of one server (or router: its name in ``server``). It must not
    block and must not raise into the supervisor."""

    def __call__(self, server: str, event: Event, /) -> None: ...


# --- nested records ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class HistoryEntry(_Record):
    """One failed attempt in a ``server.ready`` / ``server.gave_up`` history."""

    params: LaunchParams
    outcome: Outcome
    phase: Phase
    attempt: int


@dataclass(frozen=True, kw_only=True)
class RankRun(_Record):
    """A rank's running attempt (``ranks.leftovers``)."""

    rank: int
    host: str
    attempt: int


@dataclass(frozen=True, kw_only=True)
class RankPid(_Record):
    """A launched rank (``ranks.launched``)."""

    rank: int
    host: str
    pid: int


@dataclass(frozen=True, kw_only=True)
class RankOutcome(_Record):
    """How a rank that died as a consequence ended (``rank.cause``)."""

    rank: int
    node: str
    outcome: Outcome | None


# --- the state machine's (launcher.supervise.lifecycle) ---------------------------------


@dataclass(frozen=True, kw_only=True)
class ServerUnknown(Event):
    """Whether the server runs cannot be told (its attempts could not be listed)."""

    name: ClassVar[str] = "server.unknown"
    reason: str


@dataclass(frozen=True, kw_only=True)
class GpuWaiting(Event):
    """Waiting for the GPUs: a preflight's ``reason``, or the ``problems`` a wait still sees."""

    name: ClassVar[str] = "gpu.waiting"
    reason: str | None = field(default=None, metadata=_OPTIONAL)
    problems: tuple[str, ...] | None = field(default=None, metadata=_OPTIONAL)


@dataclass(frozen=True, kw_only=True)
class PhaseEntered(Event):
    name: ClassVar[str] = "phase.entered"
    phase: Phase
    attempt: int


@dataclass(frozen=True, kw_only=True)
class ServerAdopted(Event):
    """A running attempt of an earlier launcher is followed instead of launching."""

    name: ClassVar[str] = "server.adopted"
    pid: int
    attempt: int
    params: LaunchParams
    started_at: float | None  # the launch time on the host (epoch s), when known


@dataclass(frozen=True, kw_only=True)
class ProcessDied(Event):
    name: ClassVar[str] = "process.died"
    level: ClassVar[int] = logging.WARNING
    exit_status: int | None
    phase: str  # the phase's value, else the state's (launching)
    attempt: int


@dataclass(frozen=True, kw_only=True)
class StallDetected(Event):
    name: ClassVar[str] = "stall.detected"
    level: ClassVar[int] = logging.WARNING
    phase: Phase
    silent_s: float
    attempt: int


@dataclass(frozen=True, kw_only=True)
class ProbeFailed(Event):
    """A failed /health probe of a ready server, fewer than the limit in a row."""

    name: ClassVar[str] = "probe.failed"
    consecutive: int
    detail: str


@dataclass(frozen=True, kw_only=True)
class ServerUnhealthy(Event):
    name: ClassVar[str] = "server.unhealthy"
    level: ClassVar[int] = logging.WARNING
    consecutive_failures: int
    detail: str


@dataclass(frozen=True, kw_only=True)
class ServerStopped(Event):
    name: ClassVar[str] = "server.stopped"
    reason: str
    left_running: int | None  # the pid left running, if any


@dataclass(frozen=True, kw_only=True)
class AttemptStarted(Event):
    name: ClassVar[str] = "attempt.started"
    attempt: int
    params: LaunchParams
    # The first attempt: where its params came from; the estimator's guess for the params.
    why: str | None = field(default=None, metadata=_OPTIONAL)
    estimate: CostGuess | None = field(default=None, metadata=_OPTIONAL)


@dataclass(frozen=True, kw_only=True)
class ServerReady(Event):
    """Ready line seen and /health answered. ``seconds``/``attempt_seconds`` are None for an
    adopted attempt; ``resolved`` (added by the supervisor) is what SGLang resolved."""

    name: ClassVar[str] = "server.ready"
    attempt: int
    attempts: int
    seconds: float | None
    attempt_seconds: float | None
    adopted: bool
    params: LaunchParams
    history: tuple[HistoryEntry, ...]
    resolved: LaunchParams | None = field(default=None, metadata=_OPTIONAL)


@dataclass(frozen=True, kw_only=True)
class AttemptFailed(Event):
    name: ClassVar[str] = "attempt.failed"
    level: ClassVar[int] = logging.WARNING
    attempt: int
    outcome: Outcome
    confidence: Confidence
    phase: Phase
    numbers: Mapping[str, Any]  # ``Numbers.as_dict()`` when it failed
    retryable: bool
    after_ready: bool
    evidence: tuple[str, ...]  # the last decisive log lines
    advice: str


@dataclass(frozen=True, kw_only=True)
class RestartScheduled(Event):
    name: ClassVar[str] = "restart.scheduled"
    delay_s: float
    params: LaunchParams
    attempt: int
    restarts_left: int
    restart_budget: int
    restart_window_s: float


@dataclass(frozen=True, kw_only=True)
class PolicyDecided(Event):
    name: ClassVar[str] = "policy.decided"
    params: LaunchParams
    reason: str


@dataclass(frozen=True, kw_only=True)
class ServerGaveUp(Event):
    name: ClassVar[str] = "server.gave_up"
    level: ClassVar[int] = logging.ERROR
    reason: str
    attempt: int
    attempts: int
    history: tuple[HistoryEntry, ...]


@dataclass(frozen=True, kw_only=True)
class ServerInternalError(Event):
    """Supervising the server failed with an exception launcher did not expect, a bug:
    supervision of that one ends, given up (a person must look), and every other server's
    goes on. ``error`` is the exception's type and message, ``traceback`` the end of its
    formatted traceback."""

    name: ClassVar[str] = "server.internal_error"
    level: ClassVar[int] = logging.ERROR  # a bug: supervision of one server ended
    error: str
    traceback: str
    attempt: int | None = field(default=None, metadata=_OPTIONAL)


# --- the supervisor's (launcher.supervise.supervisor, launcher.supervise.ranks) ---------


@dataclass(frozen=True, kw_only=True)
class HostLost(Event):
    """The host (``node`` of a multi-node server) cannot be reached; reported every time. (The
    exception that says so is ``launcher.errors.HostUnreachable``.)"""

    name: ClassVar[str] = "host.unreachable"
    error: str
    node: str | None = field(default=None, metadata=_OPTIONAL)
    unreachable_s: float
    retry_in_s: float | None = field(default=None, metadata=_OPTIONAL)


@dataclass(frozen=True, kw_only=True)
class HostReachable(Event):
    name: ClassVar[str] = "host.reachable"
    node: str | None = field(default=None, metadata=_OPTIONAL)
    unreachable_s: float


@dataclass(frozen=True, kw_only=True)
class ListingFailed(Event):
    name: ClassVar[str] = "listing.failed"
    error: str
    retry_in_s: float


@dataclass(frozen=True, kw_only=True)
class ListingRetry(Event):
    name: ClassVar[str] = "listing.retry"
    try_: int = field(metadata=_TRY_KEY)
    error: str


@dataclass(frozen=True, kw_only=True)
class PreflightRetry(Event):
    name: ClassVar[str] = "preflight.retry"
    try_: int = field(metadata=_TRY_KEY)
    error: str


@dataclass(frozen=True, kw_only=True)
class PortWaiting(Event):
    """The server's ``port`` on ``host`` is held by someone else; the preflight waits up to
    ``wait_s`` (``gpu_free_timeout``) for it. ``holder`` says who, as far as the host tells
    (``uid``, ``pid`` where readable). Emitted when the wait starts and when the holder
    changes."""

    name: ClassVar[str] = "port.waiting"
    level: ClassVar[int] = logging.WARNING
    host: str
    port: int
    holder: str
    wait_s: float
    uid: int | None = field(default=None, metadata=_OPTIONAL)
    pid: int | None = field(default=None, metadata=_OPTIONAL)


@dataclass(frozen=True, kw_only=True)
class AttemptCorrupt(Event):
    """An adopted attempt's command file holds a value launcher cannot have written."""

    name: ClassVar[str] = "attempt.corrupt"
    attempt: int
    file: str
    value: str


@dataclass(frozen=True, kw_only=True)
class LaunchFailed(Event):
    name: ClassVar[str] = "launch.failed"
    error: str
    node: str | None = field(default=None, metadata=_OPTIONAL)
    rank: int | None = field(default=None, metadata=_OPTIONAL)


@dataclass(frozen=True, kw_only=True)
class FollowFailed(Event):
    name: ClassVar[str] = "follow.failed"
    error: str
    node: str | None = field(default=None, metadata=_OPTIONAL)
    retry_in_s: float


@dataclass(frozen=True, kw_only=True)
class Probed(Event):
    """One /health probe's result (hooks only: too frequent for the log)."""

    name: ClassVar[str] = "probe.result"
    ok: bool
    latency_s: float
    detail: str


@dataclass(frozen=True, kw_only=True)
class AttemptTailUnreadable(Event):
    name: ClassVar[str] = "attempt.tail_unreadable"
    error: str
    node: str | None = field(default=None, metadata=_OPTIONAL)


@dataclass(frozen=True, kw_only=True)
class ProcessStopFailed(Event):
    name: ClassVar[str] = "process.stop_failed"
    reason: str
    error: str
    node: str | None = field(default=None, metadata=_OPTIONAL)
    rank: int | None = field(default=None, metadata=_OPTIONAL)


@dataclass(frozen=True, kw_only=True)
class ProcessStopped(Event):
    name: ClassVar[str] = "process.stopped"
    reason: str
    signals: tuple[str, ...]
    leftover_pids: tuple[int, ...]
    node: str | None = field(default=None, metadata=_OPTIONAL)
    rank: int | None = field(default=None, metadata=_OPTIONAL)
    at: float | None = field(default=None, metadata=_OPTIONAL)


@dataclass(frozen=True, kw_only=True)
class AttemptEnded(Event):
    """How an attempt ended, with its log tail (hooks only: the ledger's record)."""

    name: ClassVar[str] = "attempt.ended"
    attempt: int
    params: LaunchParams | None = field(metadata=_EMPTY_PARAMS)
    outcome: str  # an Outcome's value, or "stopped"
    phase: str | None
    numbers: Mapping[str, Any]
    evidence: tuple[str, ...]
    advice: str
    started_at: float | None
    ended_at: float
    log_tail: str
    tail_path: str | None


@dataclass(frozen=True, kw_only=True)
class RanksLeftovers(Event):
    name: ClassVar[str] = "ranks.leftovers"
    ranks: tuple[RankRun, ...]


@dataclass(frozen=True, kw_only=True)
class RanksLaunched(Event):
    name: ClassVar[str] = "ranks.launched"
    attempt: int
    ranks: tuple[RankPid, ...]


@dataclass(frozen=True, kw_only=True)
class RankJoined(Event):
    name: ClassVar[str] = "rank.joined"
    rank: int
    node: str
    attempt: int


@dataclass(frozen=True, kw_only=True)
class RanksGateOpened(Event):
    name: ClassVar[str] = "ranks.gate_opened"
    attempt: int
    port: int


@dataclass(frozen=True, kw_only=True)
class GateRetry(Event):
    name: ClassVar[str] = "gate.retry"
    try_: int = field(metadata=_TRY_KEY)
    detail: str


@dataclass(frozen=True, kw_only=True)
class GateFailed(Event):
    name: ClassVar[str] = "gate.failed"
    port: int
    detail: str


@dataclass(frozen=True, kw_only=True)
class RankExited(Event):
    name: ClassVar[str] = "rank.exited"
    rank: int
    node: str
    attempt: int
    exit_status: int | None
    outcome: Outcome
    consequence: bool
    # True: its end was read after the stop.
    after_stop: bool | None = field(default=None, metadata=_OPTIONAL)


@dataclass(frozen=True, kw_only=True)
class RankCause(Event):
    name: ClassVar[str] = "rank.cause"
    rank: int
    node: str
    outcome: Outcome
    consequences: tuple[RankOutcome, ...]


@dataclass(frozen=True, kw_only=True)
class RankStalled(Event):
    name: ClassVar[str] = "rank.stalled"
    rank: int
    node: str
    phase: Phase
    silent_s: float


# --- the router's (launcher.supervise.router; ``server`` is the router's name)
# ------------------------


@dataclass(frozen=True, kw_only=True)
class RouterWorkerRegistered(Event):
    """``found``: the router listed it already; else registered now (``worker_id``, ``api``)."""

    name: ClassVar[str] = "router.worker_registered"
    server: str
    url: str
    found: bool | None = field(default=None, metadata=_OPTIONAL)
    worker_id: str | None = field(default=None, metadata=_OPTIONAL)
    api: str | None = field(default=None, metadata=_OPTIONAL)


@dataclass(frozen=True, kw_only=True)
class RouterWorkerDeregistered(Event):
    name: ClassVar[str] = "router.worker_deregistered"
    server: str
    url: str
    reason: str
    after_s: float | None


@dataclass(frozen=True, kw_only=True)
class RouterRegistrationFailed(Event):
    name: ClassVar[str] = "router.registration_failed"
    server: str | None
    error: str


@dataclass(frozen=True, kw_only=True)
class RouterGaveUp(Event):
    name: ClassVar[str] = "router.gave_up"
    attempt: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class RouterInternalError(Event):
    """``server.internal_error`` for a router: its supervision ended, given up."""

    name: ClassVar[str] = "router.internal_error"
    level: ClassVar[int] = logging.ERROR
    error: str
    traceback: str
    attempt: int | None = field(default=None, metadata=_OPTIONAL)


@dataclass(frozen=True, kw_only=True)
class RouterAdopted(Event):
    name: ClassVar[str] = "router.adopted"
    attempt: int
    pid: int


@dataclass(frozen=True, kw_only=True)
class RouterDied(Event):
    name: ClassVar[str] = "router.died"
    attempt: int
    exit_status: int | None
    servers: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class RouterUnhealthy(Event):
    name: ClassVar[str] = "router.unhealthy"
    attempt: int
    reason: str
    detail: str
    servers: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class RouterRestartScheduled(Event):
    name: ClassVar[str] = "router.restart_scheduled"
    delay_s: float


@dataclass(frozen=True, kw_only=True)
class RouterListingFailed(Event):
    name: ClassVar[str] = "router.listing_failed"
    error: str
    retry_in_s: float


@dataclass(frozen=True, kw_only=True)
class RouterLaunchFailed(Event):
    name: ClassVar[str] = "router.launch_failed"
    attempt: int
    error: str


@dataclass(frozen=True, kw_only=True)
class RouterLaunched(Event):
    name: ClassVar[str] = "router.launched"
    attempt: int
    pid: int
    command: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class RouterStopFailed(Event):
    name: ClassVar[str] = "router.stop_failed"
    reason: str
    error: str


@dataclass(frozen=True, kw_only=True)
class RouterFollowFailed(Event):
    name: ClassVar[str] = "router.follow_failed"
    error: str
    retry_in_s: float


@dataclass(frozen=True, kw_only=True)
class RouterReady(Event):
    name: ClassVar[str] = "router.ready"
    attempt: int
    host: str
    port: int
    seconds: float
    servers: tuple[str, ...]


# --- coordination (``[coordination]``, docs/ha.md): ``server`` is "" (the whole fleet) ----


@dataclass(frozen=True, kw_only=True)
class LeaseStandby(Event):
    """This launcher stands by: ``active_box`` holds the lease (None: nobody yet), for
    ``remaining_s`` more unless renewed."""

    name: ClassVar[str] = "lease.standby"
    box: str
    active_box: str | None = None
    remaining_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class LeaseAcquired(Event):
    """This launcher took the lease (token ``token``) and supervises from now on; a
    takeover when ``previous_box`` held it before."""

    name: ClassVar[str] = "lease.acquired"
    level: ClassVar[int] = logging.WARNING  # a takeover (or the first start)
    box: str
    token: int
    previous_box: str | None = None
    waited_s: float


@dataclass(frozen=True, kw_only=True)
class LeaseEnded(Event):
    """This launcher lost the lease (``errors.LeaseLost``): it stopped every supervision and
    does nothing more on any host; ``up`` exits 6."""

    name: ClassVar[str] = "lease.lost"
    level: ClassVar[int] = logging.ERROR  # this launcher stopped supervising
    box: str
    token: int | None = None
    reason: str


def _all_events() -> dict[str, type[Event]]:
    found: dict[str, type[Event]] = {}
    for value in list(globals().values()):
        if isinstance(value, type) and issubclass(value, Event) and value is not Event:
            assert value.name not in found, value.name  # one type per name
            found[value.name] = value
    return found


EVENTS: Mapping[str, type[Event]] = _all_events()
"""Every event type by its dotted name."""


def from_dict(name: str, data: Mapping[str, Any]) -> Event:
    """The event ``name`` whose ``to_dict`` is ``data`` (ValueError for an unknown name, a
    missing key or a value of the wrong type)."""
    try:
        cls = EVENTS[name]
    except KeyError:
        raise ValueError(f"unknown event {name!r}") from None
    return cls.from_dict(data)


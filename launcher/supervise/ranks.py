"""Supervision of a multi-node server: its ranks' I/O, presented to the state machine as one.

A server with ``nodes = [...]`` runs one SGLang process per node (``launcher.plan.multinode``).
:class:`MultiNodeSupervisor` is a :class:`~launcher.supervise.supervisor.ServerSupervisor` whose
attempt is a group of ranks: it overrides the supervisor's extension points (``survey``,
``clear_leftovers``, ``adopt``, ``preflight_checks``, ``gpu_problems``, ``launch``,
``follow_attempt``, ``stop_attempt``, ``attempt_tail``, ``host_unreachable``,
``host_reachable``) and nothing else of it. The pure state machine
(``launcher.supervise.lifecycle``) is unchanged: it sees one server, and this module turns the
ranks' events into that server's.

- **Launch**: every rank at once, each in its own run directory on its own host (node 0's is
  named like the server, the others ``<server>.node<R>``). If one launch fails, the ranks that
  did start are stopped and the attempt fails.
- **Phase**: the least advanced rank's. A node >= 1 counts as done ("joined") once it logs
  SGLang's ``Dummy health check server started`` line.
- **Gate** (SGLang >= 0.5.23, ``gated_launch_port``): once every scheduler of every node
  logged ``Gated launch waiting for activation``, all ranks have joined: launcher POSTs
  ``/gate/activate`` to node 0's gate port through node 0's transport, before any rank
  allocates its weights.
- **Ready**: node 0's ready line, once every other node has joined, then node 0's ``/health``
  through its tunnel (the base supervisor's probe). The other nodes' ``/health`` always answers
  200 and is never asked.
- **Failure**: any rank that dies or stalls fails the whole attempt. A rank that died because a
  peer did (gloo's ``Connection closed by peer``, the NCCL watchdog) is a consequence; the
  cause is the rank that died of its own error, and the attempt's diagnosis (hence the ledger,
  Slack and the policy) is the cause's, naming its node. After a consequence, up to
  ``settle_s`` is left for the cause's own exit to arrive.
- **Stop**: node 0 first (SIGTERM, ``grace``): on 0.5.23 nodes >= 1 ignore SIGTERM and wait
  for node 0's ShutdownReq. Then every other node: SIGTERM, a bounded wait
  (``follower_grace``), SIGKILL. Then the GPUs of every node must be free before the next
  launch, which starts every rank again.
- **Unreachable is not unhealthy**: an outage of any node suspends stall counting and makes
  probe failures not count; following resumes at the byte it had reached. A node is stopped
  only once it can be reached again.

Adoption: a restarted launcher adopts the group only when every node runs the same attempt;
ranks left running without the others are stopped (node 0 first) before a fresh launch.
"""

from __future__ import annotations

import collections
import copy
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
import httpx
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from launcher.config.schema import Config, ServerConfig
from launcher.errors import HostKeyError, HostUnreachable, LauncherError, reraise_lease_lost
from launcher.host import health, preflight
from launcher.host import run as remote
from launcher.host.gpus import check_gpus
from launcher.host.preflight import Problem, ProblemKind, port_in_use
from launcher.host.shell import RunDirUnsafe
from launcher.host.transport import make_transport
from launcher.host.transport.base import Transport
from launcher.plan.multinode import Rank, dist_init_addr, rank_commands, ranks_of
from launcher.sglang.classify import classify, diagnose, diagnose_text
from launcher.sglang.logparse import LineSplitter, LogFollower, PhaseLine, ReadyLine
from launcher.sglang.multinode import (
    DIST_TIMEOUT_ADVICE,
    gate_waiting_rank,
    is_consequence,
    is_joined_line,
    pick_cause,
)
from launcher.sglang.outcome import Diagnosis, Outcome
from launcher.sglang.phases import Phase
from launcher.supervise import events
from launcher.supervise.backoff import Doubling, sleep_or
from launcher.supervise.lifecycle import (
    Adopted,
    Exited,
    FatalLineSeen,
    HostRefused,
    Launch,
    Launched,
    PhaseSeen,
    ReadyLineSeen,
    Stalled,
)
from launcher.supervise.supervisor import RunningAttempt, ServerSupervisor

__all__ = ["MultiNodeSupervisor", "stop_other_ranks"]

_OUTAGE_RETRY_MAX_S = 10.0
_TAIL_LINES = 400  # per rank, for telling a consequence from a cause


class _GateShut(Exception):
    """The gate answered, but not 200 (it may not be listening yet): worth another try."""


# What one try to open the gate may fail with and still be tried again. The forward's task
# group wraps transport errors in exception groups.
_GATE_ERRORS = (httpx.HTTPError, LauncherError, OSError, ExceptionGroup, _GateShut)


def _gate_detail(exc: BaseException | None) -> str:
    return str(exc) if isinstance(exc, _GateShut) else f"{type(exc).__name__}: {exc}"


@dataclass
class _RankRun:
    """One rank of the current attempt."""

    rank: Rank
    transport: Transport
    handle: remote.RunHandle
    follower: LogFollower = field(default_factory=LogFollower)
    offset: int = 0
    last_advance: float = 0.0
    joined: bool = False  # node >= 1: its dummy-health line; node 0: its ready line
    ended: Diagnosis | None = None
    status: int | None = None
    port_reported: bool = False
    gate_waiting: set[int] = field(default_factory=set)  # world ranks waiting at the gate
    lines: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=_TAIL_LINES))

    @property
    def where(self) -> str:
        return f"node {self.rank.rank} ({self.rank.host})"

    @property
    def order(self) -> int:
        """How far this rank has come (``Phase.order``); READY once it joined."""
        if self.joined:
            return Phase.READY.order
        phase = self.follower.phase
        if phase is None:
            return Phase.INIT.order
        # Node 0's ready line counts only through ``joined`` (the others must have joined).
        return min(phase.order, Phase.WARMUP.order)


@dataclass
class _GroupAttempt(RunningAttempt):
    """An attempt of every rank; ``handle`` (and ``follower``) are node 0's."""

    ranks: list[_RankRun] = field(default_factory=list)
    reported: int = Phase.INIT.order
    ready_posted: bool = False
    failed: bool = False
    gate_opened: bool = False
    ended_order: list[_RankRun] = field(default_factory=list)


class MultiNodeSupervisor(ServerSupervisor):
    """Brings a multi-node server up and keeps it there (see the module docstring).

    ``transports`` maps each of the server's hosts to its transport (``launcher up`` makes one
    per host). ``grace`` is node 0's SIGTERM wait, ``follower_grace`` the other nodes' bounded
    wait before SIGKILL, ``settle_s`` how long a consequence waits for its cause.
    """

    def __init__(
        self,
        config: Config,
        server: ServerConfig,
        transports: dict[str, Transport],
        *,
        grace: float = 20.0,
        follower_grace: float = 10.0,
        settle_s: float = 3.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(config, server, transports[server.host], **kwargs)
        self.transports = transports
        self.ranks = ranks_of(server)
        self.grace = grace
        self.follower_grace = follower_grace
        self.settle_s = settle_s
        self._node_down: dict[str, float] = {}  # host -> since when it is unreachable
        self._node_back: dict[str, anyio.Event] = {}
        self._found: dict[int, remote.Survey] = {}  # rank -> its last listing

    # -- per-node reachability -----------------------------------------------------------

    def host_unreachable(self, exc: Exception, retry_in_s: float | None = None,
                          node: str | None = None) -> None:
        host = node or self.server.host
        now = self.clock()
        if host not in self._node_down:
            self._node_down[host] = now
            self._node_back[host] = anyio.Event()
            self._outages += 1
            self._back = self._back if self._unreachable_since is not None else anyio.Event()
            self._unreachable_since = min(self._node_down.values())
        self._emit(events.HostLost(
            error=str(exc), node=host, unreachable_s=round(now - self._node_down[host], 3),
            retry_in_s=retry_in_s))

    def host_reachable(self, node: str | None = None) -> None:
        host = node or self.server.host
        since = self._node_down.pop(host, None)
        if since is None:
            return
        self._outages += 1
        self._node_back.pop(host).set()
        self._unreachable_since = min(self._node_down.values()) if self._node_down else None
        if self._unreachable_since is None and self._back is not None:
            self._back.set()
        self._emit(events.HostReachable(node=host,
                                        unreachable_s=round(self.clock() - since, 3)))

    async def _node_wait(self, host: str, delay: float) -> None:
        await sleep_or(self.sleep, delay, self._node_back.get(host))

    def _transport(self, rank: Rank) -> Transport:
        return self.transports[rank.host]

    # -- first event: survey every node ----------------------------------------------------

    async def survey(self) -> remote.Survey:
        found: dict[int, remote.Survey] = {}
        for rank in self.ranks:
            async for attempt in self._transient_retrying(self.listing_tries, events.ListingRetry):
                with attempt:
                    found[rank.rank] = await remote.survey(
                        self._transport(rank), self.config.run_dir_of(self.server, rank.host),
                        rank.run_name, adopting=True)
        self._found = found
        latest = max(s.latest for s in found.values())
        running = [s.running for s in found.values()]
        whole = all(h is not None for h in running) and len(
            {h.attempt for h in running if h is not None}) == 1
        return remote.Survey(found[0].running if whole else None, latest)

    async def clear_leftovers(self) -> None:
        leftovers = [(rank, s.running) for rank in self.ranks
                     if (s := self._found.get(rank.rank)) is not None and s.running is not None]
        if leftovers:  # a partial group (or adoption declined): stop it, node 0 first
            self._emit(events.RanksLeftovers(ranks=tuple(
                events.RankRun(rank=r.rank, host=r.host, attempt=h.attempt)
                for r, h in leftovers)))
            for rank, handle in leftovers:
                await self._stop_rank(rank, handle, "leftover",
                                      self.grace if rank.rank == 0 else self.follower_grace)

    async def adopt(self, handle: remote.RunHandle) -> Adopted:
        params = await self._params_of(handle)
        launched = await self._launched_at(handle)
        handles = [self._found[r.rank].running for r in self.ranks]
        att = self._group([h for h in handles if h is not None])
        if launched is not None:
            att.started_wall = launched
        self._attempt = att
        self._start_attempt_tasks(att)
        return Adopted(pid=handle.pid, attempt=handle.attempt, params=params,
                       started_wall=launched)

    def _group(self, handles: list[remote.RunHandle]) -> _GroupAttempt:
        now = self.clock()
        runs = [_RankRun(rank, self._transport(rank), h, last_advance=now)
                for rank, h in zip(self.ranks, handles, strict=True)]
        return _GroupAttempt(handle=handles[0], follower=runs[0].follower, last_advance=now,
                             ranks=runs)

    # -- preflight and GPUs ----------------------------------------------------------------

    async def preflight_checks(self) -> list[Problem]:
        s = self.server
        gpus = await self.gpu_problems()
        if _missing(gpus):
            return gpus
        fatal: list[Problem] = []

        async def node_checks(rank: Rank) -> None:
            # Nodes >= 1 bind the same port for SGLang's dummy /health. A taken one is waited
            # for (on every node at once, one bound: ``_port_taken``).
            target = replace(self._preflight_target(rank.host), gpus=())
            fatal.extend(await preflight.check(self._transport(rank), target,
                                               port_check=self._port_taken))

        await _on_every_node(self.ranks, node_checks)
        if not fatal and self._port_wait_since is not None:  # the GPUs' answer is old
            gpus = await self.gpu_problems()
            if _missing(gpus):
                return gpus
        addr = dist_init_addr(self.config, s)
        if addr is not None:
            port = int(addr.rpartition(":")[2])
            if await port_in_use(self._transport(self.ranks[0]), port):
                gpus.append(Problem(
                    ProblemKind.DIST_PORT_BUSY,
                    f"dist-init port {port} is still in use on {self.ranks[0].host} "
                    "(torch's store of an earlier attempt)"))
        return sorted(fatal, key=lambda p: p.message) + gpus

    async def gpu_problems(self) -> list[Problem]:
        """Problems with the server's GPUs on every node (asked at once), each prefixed with
        its host; the first node (in rank order) with a missing GPU: only its problems."""
        found: dict[int, list[Problem]] = {}

        async def node_gpus(rank: Rank) -> None:
            target = replace(self._preflight_target(rank.host), model_path=None, port=None)
            found[rank.rank] = await preflight.check(self._transport(rank), target)

        await _on_every_node(self.ranks, node_gpus)
        problems: list[Problem] = []
        for rank in self.ranks:
            here = [p.on(rank.host) for p in found[rank.rank]]
            if _missing(here):
                return here
            problems += here
        return problems

    # -- launch ----------------------------------------------------------------------------

    async def launch(self, action: Launch) -> None:
        cmds = rank_commands(self.config, self.server, action.params, self.version,
                             self.secret_env, action.attempt)
        handles: dict[int, remote.RunHandle] = {}
        errors: list[tuple[Rank, LauncherError]] = []

        async def one(rank: Rank, spec: remote.AttemptSpec) -> None:
            try:
                handles[rank.rank] = await remote.launch(self._transport(rank), spec)
            except LauncherError as exc:
                errors.append((rank, exc))

        async with self._launching:
            async with anyio.create_task_group() as tg:
                for rank, cmd in cmds:
                    spec = remote.AttemptSpec(
                        server=rank.run_name, attempt=action.attempt,
                        run_dir=self.config.run_dir_of(self.server, rank.host), argv=cmd.argv,
                        env=cmd.env, secret_env=cmd.secret_env)
                    tg.start_soon(one, rank, spec)
            if errors:
                self._attempt = None
                with anyio.CancelScope(shield=True):
                    for rank in self.ranks:  # node 0 first
                        if rank.rank in handles:
                            await self._stop_rank(rank, handles[rank.rank], "launch failed",
                                                  self.follower_grace)
                refused = [exc for _, exc in errors if isinstance(exc, HostKeyError)]
                if refused:
                    await self._post(HostRefused(str(refused[0])))
                    return
                rank, exc = errors[0]
                self._emit(events.LaunchFailed(error=str(exc), node=rank.host,
                                               rank=rank.rank))
                diag = classify([], None)
                diag.advice = f"node {rank.rank} ({rank.host}): {exc}"
                diag.retryable = not isinstance(exc, (remote.RunDirUnwritable, RunDirUnsafe))
                await self._post(Exited(status=None, diagnosis=diag))
                return
            att = self._group([handles[r.rank] for r in self.ranks])
            self._attempt = att
            self._emit(events.RanksLaunched(attempt=action.attempt, ranks=tuple(
                events.RankPid(rank=r.rank.rank, host=r.rank.host, pid=r.handle.pid)
                for r in att.ranks)))
            await self._post(Launched(pid=att.handle.pid))
            self._start_attempt_tasks(att)

    async def follow_attempt(self, att: RunningAttempt) -> None:
        assert isinstance(att, _GroupAttempt)
        with att.scope:
            async with anyio.create_task_group() as tg:
                att.tg = tg
                for run in att.ranks:
                    tg.start_soon(self._follow_rank, att, run)
                tg.start_soon(self._group_stall_watch, att)

    # -- following ---------------------------------------------------------------------------

    async def _follow_rank(self, att: _GroupAttempt, run: _RankRun) -> None:
        host = run.rank.host
        splitter = LineSplitter()
        waits = Doubling(0.5, _OUTAGE_RETRY_MAX_S)
        while True:
            if host in self._node_down:
                try:
                    await remote.log_age(run.transport, run.handle)
                except HostUnreachable as exc:
                    wait = waits.next()
                    self.host_unreachable(exc, wait, node=host)
                    await self._node_wait(host, wait)
                    continue
                except LauncherError:
                    pass
                self.host_reachable(node=host)
            try:
                async for item in remote.follow(run.transport, run.handle, run.offset):
                    if isinstance(item, remote.LogChunk):
                        run.offset = item.end_offset
                        run.last_advance = self.clock()
                        waits.reset()
                        self.host_reachable(node=host)
                        for line in splitter.feed(item.data):
                            await self._on_rank_line(att, run, line)
                    else:
                        for line in splitter.flush():
                            await self._on_rank_line(att, run, line)
                        await self._rank_ended(att, run, item.status)
                        return
                return
            except HostKeyError as exc:
                await self._post(HostRefused(str(exc)))
                return
            except HostUnreachable as exc:
                wait = waits.next()
                self.host_unreachable(exc, wait, node=host)
                await self._node_wait(host, wait)
            except LauncherError as exc:
                status = await self._rank_status(run)
                if status is not None and not status.alive:
                    for line in splitter.flush():
                        await self._on_rank_line(att, run, line)
                    await self._rank_ended(att, run, status.exit_status)
                    return
                wait = waits.next()
                self._emit(events.FollowFailed(error=str(exc), node=host, retry_in_s=wait))
                await self.sleep(wait)

    async def _rank_status(self, run: _RankRun) -> remote.RunStatus | None:
        try:
            return await remote.probe(run.transport, run.handle)
        except HostKeyError:
            raise
        except LauncherError:
            return None

    async def _on_rank_line(self, att: _GroupAttempt, run: _RankRun, line: str) -> None:
        line = self.redact.text(line)  # whole, before anything keeps (and cuts) it
        run.lines.append(line)
        for ev in run.follower.feed_line(line):
            if isinstance(ev, ReadyLine | PhaseLine) and run.rank.rank == 0 and (
                    isinstance(ev, ReadyLine) or ev.phase is Phase.READY):
                run.joined = True
        waiting = gate_waiting_rank(line)
        if waiting is not None:
            run.gate_waiting.add(waiting)
        if run.rank.rank > 0 and not run.joined and is_joined_line(line):
            run.joined = True
            self._emit(events.RankJoined(rank=run.rank.rank, node=run.rank.host,
                                         attempt=run.handle.attempt))
        if run.follower.port_in_use is not None and not run.port_reported:
            run.port_reported = True
            diag = diagnose(run.follower, None, sglang_version=self.version)
            await self._post(FatalLineSeen(self._named(diag, run)))
        await self._aggregate(att)

    async def _aggregate(self, att: _GroupAttempt) -> None:
        """Post the group's phase (the least advanced rank's) and, once node 0 printed its
        ready line and every other node joined, the ready line."""
        if att.failed:
            return
        port = self.server.gated_launch_port
        local = self.server.tp * self.server.dp // self.server.nnodes
        if (port is not None and not att.gate_opened and att.tg is not None
                and all(len(run.gate_waiting) >= local for run in att.ranks)):
            att.gate_opened = True  # every scheduler of every node waits: all have joined
            att.tg.start_soon(self._open_gate, att, port)
        least = min(run.order for run in att.ranks)
        if att.reported < least < Phase.READY.order:
            att.reported = least
            await self._post(PhaseSeen(_phase_of_order(least)))
        if least >= Phase.READY.order and not att.ready_posted:
            att.ready_posted = True
            await self._post(ReadyLineSeen())

    async def _open_gate(self, att: _GroupAttempt, port: int, tries: int = 5) -> None:
        """POST ``/gate/activate`` to node 0's gated-launch server (0.5.23), through node 0's
        transport, tried ``tries`` times (tenacity: exponential waits with jitter, each retry
        reported as ``gate.retry``); a gate that stays shut is left to the start-up deadline
        (the ranks keep logging "still waiting" every 10 s)."""

        def retrying_note(rs: RetryCallState) -> None:
            exc = rs.outcome.exception() if rs.outcome else None
            self._emit(events.GateRetry(try_=rs.attempt_number, detail=_gate_detail(exc)))

        retrying = AsyncRetrying(
            retry=retry_if_exception_type(_GATE_ERRORS),
            stop=stop_after_attempt(tries),
            wait=wait_exponential_jitter(multiplier=0.5, max=5.0, jitter=0.25),
            before_sleep=retrying_note,
            sleep=self.sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    async with health.client_for(self.transport, port,
                                                 self.server.probe_address, 10.0,
                                                 ) as (client, url):
                        resp = await client.post(url.removesuffix("/health") + "/gate/activate")
                    if resp.status_code != 200:
                        raise _GateShut(f"HTTP {resp.status_code}")
        except _GATE_ERRORS as exc:
            reraise_lease_lost(exc)  # an exception group may hold one: not a gate failure
            self._emit(events.GateFailed(port=port, detail=_gate_detail(exc)))
            return
        self._emit(events.RanksGateOpened(attempt=att.handle.attempt, port=port))

    # -- failures ------------------------------------------------------------------------------

    async def _rank_ended(self, att: _GroupAttempt, run: _RankRun, status: int | None) -> None:
        run.follower.finish()
        diag = diagnose(run.follower, status, sglang_version=self.version)
        run.ended, run.status = diag, status
        att.ended_order.append(run)
        consequence = is_consequence(diag, run.lines)
        self._emit(events.RankExited(
            rank=run.rank.rank, node=run.rank.host, attempt=run.handle.attempt,
            exit_status=status, outcome=diag.outcome, consequence=consequence,
        ))
        if att.failed:
            return
        if not consequence:
            await self._fail_group(att)
        elif att.tg is not None:
            att.tg.start_soon(self._settle, att)

    async def _settle(self, att: _GroupAttempt) -> None:
        """A rank died of a peer's death: give the peer's own exit ``settle_s`` to arrive."""
        await self.sleep(self.settle_s)
        if not att.failed:
            await self._fail_group(att)

    async def _fail_group(self, att: _GroupAttempt) -> None:
        att.failed = True
        ended = [(r.rank.rank, r.ended, is_consequence(r.ended, r.lines))
                 for r in att.ended_order if r.ended is not None]
        cause = att.ended_order[pick_cause(ended)]
        assert cause.ended is not None
        consequences = [r for r in att.ended_order if r is not cause]
        self._emit(events.RankCause(
            rank=cause.rank.rank, node=cause.rank.host, outcome=cause.ended.outcome,
            consequences=tuple(events.RankOutcome(rank=r.rank.rank, node=r.rank.host,
                                                  outcome=r.ended.outcome if r.ended else None)
                               for r in consequences),
        ))
        diag = self._named(cause.ended, cause)
        for r in consequences:
            diag.remarks.append(f"{r.where} died as a consequence "
                                f"({r.ended.outcome.value if r.ended else 'unknown'})")
        await self._post(Exited(status=cause.status, diagnosis=diag))

    def _named(self, diag: Diagnosis, run: _RankRun) -> Diagnosis:
        """``diag`` with the rank's node named in its rank and advice (a copy)."""
        named = copy.deepcopy(diag)
        named.rank = f"{run.where}{' ' + diag.rank if diag.rank else ''}"
        named.advice = f"{run.where}: {diag.advice}" if diag.advice else run.where
        if run.joined:  # a node >= 1 that had joined was serving: its log shows no ready line
            named.phase = Phase.READY
        if named.outcome in (Outcome.NCCL_ERROR, Outcome.HANG):
            named.advice += f". {DIST_TIMEOUT_ADVICE}"
        return named

    async def _group_stall_watch(self, att: _GroupAttempt) -> None:
        """A rank whose log stays silent past its own phase's budget (confirmed by its host's
        clock) stalls the group; the least advanced such rank is named. Nothing counts while
        any node is unreachable."""
        budgets = self.policy.stall
        while True:
            await self.sleep(self.tick)
            if att.failed:
                return
            if self._node_down:
                now = self.clock()
                for run in att.ranks:
                    run.last_advance = max(run.last_advance, now - self.tick)
                continue
            over: list[tuple[int, float, _RankRun]] = []
            for run in att.ranks:
                if run.joined or run.ended is not None:
                    continue
                phase = _phase_of_order(run.order)
                silent = self.clock() - run.last_advance
                if silent > budgets.for_phase(phase):
                    over.append((run.order, -silent, run))
            if not over:
                continue
            over.sort(key=lambda item: (item[0], item[1]))
            run = over[0][2]
            phase = _phase_of_order(run.order)
            budget = budgets.for_phase(phase)
            try:
                age = await remote.log_age(run.transport, run.handle)
            except HostUnreachable as exc:
                self.host_unreachable(exc, node=run.rank.host)
                continue
            except LauncherError:
                age = self.clock() - run.last_advance
            else:
                self.host_reachable(node=run.rank.host)
            if age <= budget:
                run.last_advance = self.clock() - age  # it wrote; our follower lags
                continue
            att.failed = True
            self._emit(events.RankStalled(rank=run.rank.rank, node=run.rank.host,
                                          phase=phase, silent_s=round(age, 2)))
            await self._post(Stalled(silent_s=age, where=f"{run.where}"))
            return

    # -- stopping --------------------------------------------------------------------------

    async def stop_attempt(self, att: RunningAttempt, reason: str) -> None:
        assert isinstance(att, _GroupAttempt)
        await self._stop_group(att, reason)

    async def attempt_tail(self, att: RunningAttempt) -> str:
        """Every rank's tail under a ``===== node R (host): dir/log =====`` header; a rank
        whose end was not seen before the stop gets its ``rank.exited`` from it."""
        assert isinstance(att, _GroupAttempt)
        tails = []
        for run in att.ranks:
            try:
                tail = await remote.tail_log(run.transport, run.handle)
            except LauncherError as exc:
                self._emit(events.AttemptTailUnreadable(error=str(exc), node=run.rank.host))
                continue
            text = tail.decode("utf-8", errors="replace")
            tails.append(f"===== {run.where}: {run.handle.dir}/log =====\n{text}")
            if run.ended is None and att.failed:
                self._late_end(run, text)
        return "\n".join(tails)

    def _late_end(self, run: _RankRun, tail: str) -> None:
        """A rank whose end the follower did not see before the stop (the attempt had failed
        already): how its log ends, for the record (``rank.exited`` with ``after_stop``)."""
        diag = diagnose_text(tail, None, sglang_version=self.version)
        lines = tail.splitlines()[-_TAIL_LINES:]
        self._emit(events.RankExited(
            rank=run.rank.rank, node=run.rank.host, attempt=run.handle.attempt,
            exit_status=None, outcome=diag.outcome,
            consequence=is_consequence(diag, lines), after_stop=True,
        ))

    async def _stop_group(self, att: _GroupAttempt, reason: str) -> None:
        """Node 0 first, then every other node at once (bounded wait, then SIGKILL)."""
        first, *others = att.ranks
        await self._stop_rank(first.rank, first.handle, reason, self.grace)
        if others:
            async with anyio.create_task_group() as tg:
                for run in others:
                    tg.start_soon(self._stop_rank, run.rank, run.handle, reason,
                                  self.follower_grace)

    async def _stop_rank(self, rank: Rank, handle: remote.RunHandle, reason: str,
                         grace: float) -> None:
        """Stop one rank; while its host is unreachable, wait and try again (no relaunch may
        start beside a rank that could not be stopped). Each try is shielded."""
        transport = self._transport(rank)
        waits = Doubling(0.5, _OUTAGE_RETRY_MAX_S)
        while True:
            with anyio.CancelScope(shield=True):
                try:
                    report = await remote.stop(transport, handle, grace=grace, kill_wait=5.0)
                except HostUnreachable as exc:
                    self.host_unreachable(exc, waits.current, node=rank.host)
                except LauncherError as exc:
                    self._emit(events.ProcessStopFailed(reason=reason, error=str(exc),
                                                        node=rank.host, rank=rank.rank))
                    return
                else:
                    self.host_reachable(node=rank.host)
                    self._emit(events.ProcessStopped(
                        reason=reason, signals=tuple(report.signals_sent),
                        leftover_pids=tuple(report.leftover_pids), node=rank.host,
                        rank=rank.rank, at=time.time(),
                    ))
                    return
            await self._node_wait(rank.host, waits.next())


async def _on_every_node(ranks: list[Rank],
                         check: Callable[[Rank], Awaitable[None]]) -> None:
    """``check`` on every rank's node at once; the first LauncherError (in rank order) is
    raised as itself, not in an exception group, so callers' retry rules see it."""
    errors: dict[int, LauncherError] = {}

    async def one(rank: Rank) -> None:
        try:
            await check(rank)
        except LauncherError as exc:
            errors[rank.rank] = exc

    async with anyio.create_task_group() as tg:
        for rank in ranks:
            tg.start_soon(one, rank)
    if errors:
        raise errors[min(errors)]


def _missing(problems: list[Problem]) -> bool:
    return any(p.kind is ProblemKind.GPU_MISSING for p in problems)


def _phase_of_order(order: int) -> Phase:
    return list(Phase)[order]


async def stop_other_ranks(config: Config, server: ServerConfig, *, grace: float = 10.0,
                           ) -> list[str]:
    """``launcher down`` for a multi-node server's nodes >= 1, after node 0: each node's
    running rank is stopped (SIGTERM, ``grace``, SIGKILL) and its GPUs checked, over a
    transport of its own. One line per node; a node that cannot be asked says why."""
    lines: list[str] = []
    for rank in ranks_of(server)[1:]:
        host = config.host(rank.host)
        transport = make_transport(host)
        where = f"node {rank.rank} ({rank.host})"
        try:
            run_dir = config.run_dir_of(server, rank.host)
            handle = await remote.find_running(transport, run_dir, rank.run_name)
            done = "not running (it goes with node 0)"
            if handle is not None:
                report = await remote.stop(transport, handle, grace=grace)
                signals = "+".join(report.signals_sent) or "none needed"
                done = f"stopped (pid {handle.pid}, {signals})"
            deadline = anyio.current_time() + config.policy_for(server.name).gpu_free_timeout
            while True:
                problems = await check_gpus(transport, host.nvidia_smi, server.gpus)
                if not problems or anyio.current_time() > deadline:
                    break
                await anyio.sleep(1.0)
            state = f"GPUs not free: {'; '.join(problems)}" if problems else "GPUs free"
            lines.append(f"{where}: {done}; {state}")
        except LauncherError as exc:
            lines.append(f"{where}: could not be stopped (GPUs not free): {exc}")
        finally:
            with anyio.CancelScope(shield=True):
                await transport.aclose()
    return lines

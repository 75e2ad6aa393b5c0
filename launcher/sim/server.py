"""A simulated SGLang server: ``python -m launcher.sim.server <SGLang flags>``.

It parses SGLang's flags in the dialect of ``SGLANG_SIM_VERSION`` (default 0.5.23), reads the
model's ``config.json`` (HF keys plus a ``"sim"`` object), runs SGLang's start-up memory
arithmetic (:func:`launcher.sim.memory.simulate`) against the GPUs of the sim host
(``SGLANG_SIM_HOST``, see :mod:`launcher.sim.gpustate`), and plays the start-up out in real
processes and real time (scaled by the host's ``time_scale``): the log lines SGLang prints, its
failure tracebacks and exit statuses, its process tree, its HTTP API and its shutdown.

The model's ``config.json`` and the flags become a scenario in :mod:`launcher.sim.model`
(its ``"sim"`` object is documented there); the command line is :mod:`launcher.sim.cmdline`.

Exit statuses: 2 argparse; 1 config errors (missing model...); 3 HTTP port taken; -9 (137) when
SGLang kills its own tree (scheduler exceptions, shutdown) or a die_silently fault; -15 (143)
for SIGTERM before the ready line.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from launcher.params import LaunchParams
from launcher.sglang.autoargs import auto_chunked_prefill_size
from launcher.sglang.lora import LoraShape
from launcher.sglang.phases import Phase
from launcher.sglang.versions import DEFAULT_VERSION
from launcher.sim import gpustate, logfmt
from launcher.sim.cmdline import Flags
from launcher.sim.faults import Fault, FaultKind, FaultPlan, FaultProfileError
from launcher.sim.gpustate import HostConfigError, SimGpuHost
from launcher.sim.http import (
    ApiInfo,
    SimHttpServer,
    SimServerState,
    WarmupEnd,
    reason,
    run_warmup,
)
from launcher.sim.logfmt import ERROR, INFO, WARNING, Dialect, LogWriter
from launcher.sim.memory import (
    Failure,
    MemoryScenario,
    PassTrace,
    StartupTrace,
    simulate,
)
from launcher.sim.model import (
    ConfigFailure,
    Hybrid,
    ModelSpec,
    Speculative,
    load_model,
    resolve_hybrid,
    resolve_lora_shape,
    resolve_speculative,
    scenario_for,
)
from launcher.sim.multinode import (
    CROSS_NODE_ALLREDUCE,
    DUMMY_STARTED,
    DUMMY_STOPPED,
    GLOO_CONNECTED,
    GLOO_PEER_CLOSED,
    SIGTERM_IGNORED,
    TCPSTORE_IN_USE,
    Fabric,
    serve_dummy_health,
    serve_gate,
)

ENV_VERSION = "SGLANG_SIM_VERSION"

# Nominal phase durations in seconds, multiplied by the host's time_scale (and slow faults).
NOMINAL_S = {
    Phase.INIT: 15.0,
    Phase.WEIGHTS: 75.0,
    Phase.KV_CACHE: 5.0,
    Phase.CUDA_GRAPH: 45.0,
    Phase.WARMUP: 10.0,
}
GENERATE_NOMINAL_S = 0.5  # one /generate after warmup
WARMUP_POLL_NOMINAL_S = 1.0  # SGLang's warmup polls the model-info path once a second
DRAIN_POLL_NOMINAL_S = 5.0  # SGLang's sigterm watchdog wakes every 5 s
GATE_LOG_NOMINAL_S = 10.0  # gated_launch.py LOG_INTERVAL_SECONDS
TORCH_COMPILE_SLOWDOWN = 10.0  # capture steps that also compile take this much longer
DRAFT_WEIGHTS_SHARE = 0.12  # a draft's weight load against the target's (docs/incidents.md: 8.82 s)
MAX_PREFILL_TOKENS = 16384


# ---------------------------------------------------------------------------------------------
# The server


@dataclass
class Rank:
    """One scheduler: its place in the TP/DP grid, its GPU and its memory."""

    index: int
    tp_rank: int
    dp_rank: int
    label: str | None
    name: str
    phys: int | None  # physical GPU, None when CUDA_VISIBLE_DEVICES has too few
    proc: subprocess.Popen[bytes] | None = None
    others: list[tuple[int, float]] = field(default_factory=list)  # (pid, GiB) on its GPU
    used_gib: float = 0.0
    graph_gib: float = 0.0

    @property
    def others_gib(self) -> float:
        return sum(g for _, g in self.others)


def role(pass_name: str) -> str:
    """``target`` or ``draft``: the role word of a capture pass's lines."""
    return pass_name.split("_", 1)[0]


class Server:
    """One simulated server process. :meth:`run` plays the start-up and serves; the failure
    paths end the process the way SGLang does (they never return)."""

    def __init__(
        self,
        flags: Flags,
        d: Dialect,
        host: SimGpuHost,
        model: ModelSpec,
        plan: FaultPlan,
        log: LogWriter,
        spec: Speculative | None = None,
        hybrid: Hybrid | None = None,
        lora: LoraShape | None = None,
    ) -> None:
        self.flags, self.d, self.host, self.model, self.plan, self.log = (
            flags,
            d,
            host,
            model,
            plan,
            log,
        )
        self.spec, self.hybrid, self.lora = spec, hybrid, lora
        self.pid = os.getpid()
        self.scale = host.time_scale
        self.context_len = flags.context_length or model.max_position_embeddings
        self.chunk = flags.chunked_prefill_size or auto_chunked_prefill_size(
            host.gpu_total_gib, d.version
        )
        self.ranks: list[Rank] = []
        self.registration: gpustate.Registration | None = None
        self.detokenizer: subprocess.Popen[bytes] | None = None
        self.scenario = self._scenario(0.0)
        self.mfs, self.bs = self._resolve()
        self.trace: StartupTrace | None = None
        self.api_key = flags.api_key
        self.enable_metrics = flags.enable_metrics
        self.strict_probes = d.since(0, 5, 23)
        self.phase = Phase.INIT
        self._phase_t0 = time.monotonic()
        self._dying = False
        self._lock = threading.Lock()
        self._ready_at: float | None = None
        self._sigterm_at: float | None = None
        self._next_drain: float | None = None
        self._hung = False
        self._unhealthy = False
        self._served_any = False
        self._inflight = 0
        self._stop_warmup = threading.Event()
        self._forever = threading.Event()
        # Multi-node: this node's place and its link to the others (launcher.sim.multinode).
        self.node_rank = flags.node_rank
        self.fabric = (Fabric(flags.nnodes, flags.node_rank, flags.dist_init_addr)
                       if flags.nnodes > 1 and flags.dist_init_addr else None)
        self._joined = False  # node >= 1: its schedulers are ready (SIGTERM handler installed)
        if self.node_rank > 0:
            log.bars = False

    # -- resolution -----------------------------------------------------------------------

    def _scenario(self, other_used_gib: float) -> MemoryScenario:
        return scenario_for(
            self.model,
            self.host.gpu_total_gib,
            self.flags.tp,
            other_used_gib,
            self.d.version,
            flags=self.flags,
            spec=self.spec,
            hybrid=self.hybrid,
            gpu_name=self.host.gpu_name,
            lora=self.lora,
        )

    def _resolve(self) -> tuple[float, int]:
        f = self.flags
        mfs, bs = self.scenario.resolve(LaunchParams(f.mem_fraction_static, f.graph_bs))
        if f.max_running_requests is not None and self.spec is None:
            bs = max(1, min(bs, f.max_running_requests))
        return mfs, bs

    def _args_items(self) -> list[tuple[str, Any]]:
        f, d = self.flags, self.d
        graph: list[tuple[str, Any]]
        if d.since(0, 5, 23):
            graph = [
                (
                    "cuda_graph_config",
                    {
                        "backend_decode": "disabled" if f.disable_cuda_graph else "full",
                        "backend_prefill": "disabled" if f.disable_cuda_graph else "breakable",
                        "bs_decode": None,
                        "bs_prefill": None,
                    },
                ),
                ("cuda_graph_max_bs_prefill", f.graph_bs_prefill or self.chunk),
                ("cuda_graph_max_bs_decode", self.bs),
            ]
        elif d.since(0, 5, 15):
            graph = [
                ("disable_cuda_graph", f.disable_cuda_graph),
                ("cuda_graph_max_bs_decode", self.bs),
                ("cuda_graph_max_bs_prefill", f.graph_bs_prefill or self.chunk),
            ]
        else:
            graph = [("disable_cuda_graph", f.disable_cuda_graph), ("cuda_graph_max_bs", self.bs)]
        # SGLang logs the resolved arguments (0.5.23 engine.py:311 ``resolved_dict()``; 0.5.10
        # the ServerArgs after __post_init__): the speculative shape as resolved (topk 1 forces
        # steps + 1 draft tokens) and the Mamba strategy as resolved, in the version's key.
        spec, hybrid = self.spec, self.hybrid
        resolved: list[tuple[str, Any]] = []
        if d.since(0, 5, 10):
            resolved = [
                ("speculative_num_steps", spec.steps if spec else None),
                ("speculative_eagle_topk", spec.topk if spec else None),
                ("speculative_num_draft_tokens", spec.draft_tokens if spec else None),
                # 0.5.10 turns ``auto`` into ``no_buffer`` for every model
                # (server_args.py:964-967); 0.5.23 keeps ``auto`` for models without Mamba state.
                ("mamba_radix_cache_strategy", hybrid.strategy if hybrid else "auto")
                if d.since(0, 5, 23)
                else ("mamba_scheduler_strategy", hybrid.strategy if hybrid else "no_buffer"),
            ]
        return [
            ("model_path", f.model_path),
            ("tokenizer_path", f.model_path),
            ("tokenizer_mode", "auto"),
            ("load_format", f.load_format),
            ("trust_remote_code", f.trust_remote_code),
            ("context_length", f.context_length),
            ("host", f.host),
            ("port", f.port),
            ("dtype", f.dtype),
            ("quantization", f.quantization),
            ("kv_cache_dtype", f.kv_cache_dtype),
            ("mem_fraction_static", self.mfs),
            # Resolved: speculative decoding's reset to 48 happens before the dump.
            ("max_running_requests", spec.max_running_requests if spec else f.max_running_requests),
            ("max_total_tokens", f.max_total_tokens),
            ("chunked_prefill_size", self.chunk),
            ("max_prefill_tokens", MAX_PREFILL_TOKENS),
            ("page_size", 1),
            ("tp_size", f.tp),
            ("pp_size", 1),
            ("dp_size", f.dp),
            ("nnodes", f.nnodes),
            ("node_rank", f.node_rank),
            ("dist_init_addr", f.dist_init_addr),
            ("random_seed", f.random_seed),
            ("watchdog_timeout", f.watchdog_timeout),
            ("dist_timeout", f.dist_timeout),
            ("log_level", f.log_level),
            ("log_level_http", f.log_level_http),
            ("api_key", f.api_key),
            ("enable_metrics", f.enable_metrics),
            ("served_model_name", f.served_model_name),
            ("attention_backend", f.attention_backend or "fa3"),
            ("speculative_algorithm", f.speculative_algorithm),
            *resolved,
            *graph,
            ("enable_torch_compile", f.enable_torch_compile),
            ("torch_compile_max_bs", f.torch_compile_max_bs),
            ("skip_server_warmup", f.skip_server_warmup),
        ]

    # -- time and children -----------------------------------------------------------------

    def _sleep(self, seconds: float) -> None:
        """Sleep, watching the scheduler children (a dead one takes the tree down)."""
        end = time.monotonic() + seconds
        while True:
            self._check_children()
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.02))

    def _check_children(self) -> None:
        if self._dying or threading.current_thread() is not threading.main_thread():
            return
        if self.fabric is not None and self.fabric.lost is not None:
            self._peer_died(self.fabric.lost)
        for r in self.ranks:
            if r.proc is not None and r.proc.poll() is not None:
                time.sleep(0.05)
                if self._dying:  # another thread is taking the tree down
                    self._forever.wait()
                self._child_died(r, r.proc.returncode)

    def _child_died(self, r: Rank, code: int) -> NoReturn:
        if self.d.since(0, 5, 23):
            self.log.record(
                None,
                f"Subprocess {r.name} (pid={r.proc.pid if r.proc else 0}) "
                f"crashed with exit code {code}. Triggering SIGQUIT for cleanup...",
                ERROR,
            )
        else:
            self.log.record(
                None,
                f"Rank {r.index} scheduler is dead. Please check if there are relevant logs.",
                ERROR,
            )
            self.log.record(None, f"Exit code: {code}", ERROR)
        self._parent_sigquit()

    def _enter(self, phase: Phase) -> float:
        """Start ``phase``; returns its (scaled, slowed) duration in seconds."""
        self.phase = phase
        self._phase_t0 = time.monotonic()
        return NOMINAL_S[phase] * self.scale * self.plan.slow_factor(phase)

    def _nominal(self, phase: Phase) -> float:
        return NOMINAL_S[phase] * self.plan.slow_factor(phase)

    def _due(self, *, final: bool = False) -> None:
        """Fire the current phase's die/hang/nccl fault once its time has come."""
        fault = self.plan.in_phase(self.phase)
        if fault is not None and (final or time.monotonic() - self._phase_t0 >= fault.after_s):
            self._fire(fault)

    def _wait(self, seconds: float) -> None:
        self._sleep(seconds)
        self._due()

    def _fire(self, fault: Fault) -> None:
        if fault.kind is FaultKind.DIE_SILENTLY:
            self._sigkill_self()
        if fault.kind is FaultKind.HANG:
            self._hang_forever()
        if fault.kind is FaultKind.NCCL_ERROR:
            self._nccl_crash()

    def _hang_forever(self) -> NoReturn:
        while True:
            self._sleep(3600)

    def _sigkill_self(self) -> NoReturn:
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(10)
        os._exit(137)

    def _kill_tree(self) -> NoReturn:
        """SGLang's ``kill_process_tree(os.getpid(), include_parent=True)``."""
        self._dying = True
        if self.d.since(0, 5, 23):
            self.log.record(None, logfmt.kill_process_tree_line(self.pid))
        self._release()
        self._sigkill_self()

    def _release(self) -> None:
        """Kill the children and drop the memory registration, unless they are to be orphans
        that keep holding memory (an orphan_hold fault)."""
        if self.plan.orphan_hold_s > 0:
            return
        procs = [r.proc for r in self.ranks if r.proc is not None]
        if self.detokenizer is not None:
            procs.append(self.detokenizer)
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
        if self.registration is not None:
            self.registration.release()

    def _parent_sigquit(self) -> NoReturn:
        line = logfmt.sigquit_while_serving() if self._served_any else logfmt.SIGQUIT_BEFORE_SERVING
        self.log.record(None, line, ERROR)
        self._kill_tree()

    def _scheduler_crash(self, rank: Rank, tb: str) -> NoReturn:
        self.log.record(rank.label, "Scheduler hit an exception: " + tb, ERROR)
        self._parent_sigquit()

    # -- memory ----------------------------------------------------------------------------

    def _publish(self) -> None:
        if self.registration is None:
            return
        used: dict[int, float] = {}
        for r in self.ranks:
            if r.phys is not None:
                used[r.phys] = used.get(r.phys, 0.0) + r.used_gib
        self.registration.update(used)

    def _allocate(self, gib: float, *, graph: bool = False) -> None:
        for r in self.ranks:
            r.used_gib += gib
            if graph:
                r.graph_gib += gib
        self._publish()

    @property
    def busiest(self) -> Rank:
        """The rank with the least free memory (most held by others); it fails first."""
        return max(self.ranks, key=lambda r: (r.others_gib, -r.index))

    def _avail(self, r: Rank, busiest_value: float) -> float:
        """A figure the trace gives for the busiest rank, as rank ``r`` sees it."""
        return busiest_value + (self.busiest.others_gib - r.others_gib)

    def _oom(self, r: Rank, tried: float, free: float) -> str:
        total = self.host.gpu_total_gib
        this = max(0.0, total - free - r.others_gib)
        return "torch.OutOfMemoryError: " + logfmt.cuda_oom(
            tried_gib=tried,
            gpu=r.index,
            total_gib=total,
            free_gib=max(0.0, free),
            others=r.others,
            this_process_gib=this,
            allocated_gib=max(0.0, this - self.scenario.context_gib),
            private_pools_gib=r.graph_gib,
        )

    # -- start-up --------------------------------------------------------------------------

    def run(self) -> int:
        """Play the start-up and serve. Returns an exit status only for a port already in
        use (3); every other end is a signal."""
        f, d, log = self.flags, self.d, self.log
        log.record(None, logfmt.server_args_line(d, self._args_items()))
        if f.disable_cuda_graph and d.since(0, 5, 23):
            log.record(
                None,
                "--disable-cuda-graph is deprecated; it now sets "
                "--cuda-graph-backend-decode=disabled --cuda-graph-backend-prefill=disabled.",
                WARNING,
            )
        if f.deprecated_graph_flag:
            log.record(
                None, "--cuda-graph-max-bs is deprecated; use --cuda-graph-max-bs-decode.", WARNING
            )
        for warning in self.spec.warnings if self.spec is not None else ():
            log.record(None, warning, WARNING)
        log.record(
            None, "Using default HuggingFace chat template with detected content format: string"
        )
        signal.signal(signal.SIGTERM, self._on_sigterm)
        self._spawn()
        self._init_phase()
        self._weights_phase()
        self._lora_phase()
        draft_after_target = self.spec is not None and not self.scenario.new_order
        if self.spec is not None and self.scenario.new_order:
            self._draft_weights_phase()
        self._kv_phase()
        fail = self._trace().failure
        if fail is None or fail.kind != "attention_buffers":
            # init_attention_backend: the backend's buffers, after the pool, before capture
            self._allocate(self.scenario.attention_buffers_gib)
        self._graph_phase(self._trace().passes if not draft_after_target else self._target_passes())
        if draft_after_target:
            self._draft_weights_phase()
            self._draft_kv_phase()
            self._graph_phase([p for p in self._trace().passes if p.draft])
        if self.fabric is not None and self.node_rank > 0:
            self._serve_as_follower()
        self._wait_for_nodes()
        self._summary()
        return self._serve()

    def _target_passes(self) -> list[PassTrace]:
        return [p for p in self._trace().passes if not p.draft]

    def _spawn(self) -> None:
        f = self.flags
        devices = gpustate.visible_devices(self.host, os.environ)
        hold = self.plan.orphan_hold_s
        holders: list[gpustate.Holder] = []
        nnodes = max(f.nnodes, 1)
        local = f.tp * f.dp // nnodes  # a node runs its share of the (global) TP x DP grid
        first_global = f.node_rank * local
        for global_index in range(first_global, first_global + local):
            dp_rank, tp_rank = divmod(global_index, f.tp)
            index = global_index - first_global
            label = logfmt.rank_label(
                tp_rank=tp_rank, tp_size=f.tp, dp_rank=dp_rank, dp_size=f.dp
            )
            name = (
                f"sglang::scheduler_DP{dp_rank}_TP{tp_rank}"
                if f.dp > 1
                else f"sglang::scheduler_TP{tp_rank}"
            )
            phys = devices[index] if index < len(devices) else None
            r = Rank(index, tp_rank, dp_rank, label, name, phys)
            r.proc = gpustate.spawn_holder(name, hold_s=hold if phys is not None else 0.0)
            if phys is not None:
                holders.append(gpustate.holder_of(r.proc, phys, name))
            self.ranks.append(r)
        self.detokenizer = gpustate.spawn_holder("sglang::detokenizer", hold_s=0.0)
        self.registration = gpustate.Registration(self.host, self.pid, holders)

    def _init_phase(self) -> None:
        d, log = self.d, self.log
        duration = self._enter(Phase.INIT)
        # What others hold on each of our GPUs now: SGLang's "pre" is measured on these.
        held: dict[int, list[tuple[int, float]]] = {}
        for p in gpustate.processes(self.host, exclude_server=self.pid):
            held.setdefault(p.gpu, []).append((p.pid, p.used_gib))
        for r in self.ranks:
            r.others = held.get(r.phys, []) if r.phys is not None else []
        self.scenario = self._scenario(self.busiest.others_gib)
        self.trace = trace = simulate(self.scenario, LaunchParams(self.mfs, self.bs))
        for r in self.ranks:
            log.record(r.label, logfmt.init_begin(d))
        if self.fabric is not None:
            self._rendezvous()
        fail = trace.failure
        if fail is None or fail.phase is not Phase.INIT:
            self._allocate(self.scenario.context_gib)
        self._due()
        self._wait(duration)
        missing = next((r for r in self.ranks if r.phys is None), None)
        if missing is not None:
            tb = logfmt.traceback_text(logfmt.device_frames(d), logfmt.INVALID_DEVICE)
            self._scheduler_crash(missing, tb)
        if fail is not None and fail.phase is Phase.INIT:
            r = self.busiest
            tb = logfmt.traceback_text(
                logfmt.init_frames(d), self._oom(r, fail.tried_gib or 0.0, fail.free_gib or 0.0)
            )
            self._scheduler_crash(r, tb)
        self._due(final=True)
        nccl = self.flags.tp > 1  # pynccl exists only inside a TP group
        first = self.ranks[0]
        if nccl and not d.since(0, 5, 23):
            log.record(first.label, f"sglang is using nccl=={logfmt.NCCL_VERSION}")
        ends = logfmt.init_end(
            d, elapsed_s=self._nominal(Phase.INIT), mem_usage_gib=self.scenario.context_gib
        )
        # bootstrap.py: the gate sits between "Init parallel ends" and the memory baseline.
        gate = self.flags.gated_launch_port is not None
        for r in self.ranks:
            for line in ends[:1] if gate else ends:
                log.record(r.label, line)
        if gate:
            self._gated_launch()
            for r in self.ranks:
                for line in ends[1:]:
                    log.record(r.label, line)
        if nccl and d.since(0, 5, 23):
            log.record(first.label, f"sglang is using nccl=={logfmt.NCCL_VERSION}")
            log.record(
                first.label, f"NCCL/RCCL/HCCL warmup completed in 0.41s (tp_size={self.flags.tp})"
            )

    # -- multi-node ------------------------------------------------------------------------

    def _rendezvous(self) -> None:
        """torch's store rendezvous: node 0 listens on --dist-init-addr and waits for every
        node; the others connect (retrying). Then gloo's line from every scheduler."""
        fabric = self.fabric
        assert fabric is not None
        if fabric.rank == 0:
            try:
                fabric.listen()
            except OSError:
                tb = logfmt.traceback_text(logfmt.init_frames(self.d),
                                           TCPSTORE_IN_USE.format(port=fabric.port))
                self._scheduler_crash(self.ranks[0], tb)
        fabric.rendezvous()
        world = self.flags.tp * self.flags.dp
        for r in self.ranks:
            index = r.dp_rank * self.flags.tp + r.tp_rank
            self.log.raw(GLOO_CONNECTED.format(rank=index, peers=world - 1) + "\n")
        for r in self.ranks:
            self.log.record(r.label, CROSS_NODE_ALLREDUCE, WARNING)

    def _gated_launch(self) -> None:
        """0.5.23 ``maybe_wait_for_gated_launch``: world rank 0 serves ``/gate/activate`` on
        ``--host:--gated-launch-port``; every scheduler waits, logging every 10 s, until rank
        0's flag (broadcast over the CPU group) says activated."""
        port = self.flags.gated_launch_port
        assert port is not None
        opened = threading.Event()
        if self.node_rank == 0:
            try:
                serve_gate((self._bind_host(), port), opened)
            except OSError as exc:
                tb = logfmt.traceback_text(logfmt.init_frames(self.d), f"OSError: {exc}")
                self._scheduler_crash(self.ranks[0], tb)
            self.log.record(self.ranks[0].label,
                            f"Gated launch control server started on {self.flags.host}:{port}")
        world = [r.dp_rank * self.flags.tp + r.tp_rank for r in self.ranks]
        for r, w in zip(self.ranks, world, strict=True):
            self.log.record(r.label, f"Gated launch waiting for activation. rank={w}")
        started = time.monotonic()
        every = GATE_LOG_NOMINAL_S * self.scale
        next_log = started + every
        while True:
            if self.node_rank == 0 and opened.is_set() and self.fabric is not None:
                self.fabric.open_gate()
            if opened.is_set() or (self.fabric is not None and self.fabric.gate.is_set()):
                break
            self._sleep(min(0.02, every))
            if time.monotonic() >= next_log:
                waited = (time.monotonic() - started) / max(self.scale, 1e-9)
                for r, w in zip(self.ranks, world, strict=True):
                    self.log.record(r.label, "Gated launch still waiting for activation. "
                                    f"rank={w} elapsed={waited:.0f} s")
                next_log += every
        waited = (time.monotonic() - started) / max(self.scale, 1e-9)
        for r in self.ranks:
            self.log.record(r.label, f"Gated launch activated. elapsed={waited:.2f} s")

    def _peer_died(self, peer: tuple[str, int]) -> NoReturn:
        """A peer node's connection closed without a shutdown: gloo's error in this node's
        next collective (wrapped by the capture's handler during graph capture)."""
        d = self.d
        error = GLOO_PEER_CLOSED.format(address=peer[0], port=peer[1])
        r = self.ranks[0]
        if self.phase is Phase.CUDA_GRAPH:
            inner = logfmt.traceback_text(logfmt.capture_inner_frames(d), error)
            outer = logfmt.traceback_text(
                logfmt.capture_outer_frames(d),
                "Exception: " + logfmt.capture_failed(d, error.split(": ", 1)[1]),
            )
            self._scheduler_crash(r, logfmt.chained(inner, outer))
        frames = {
            Phase.WEIGHTS: logfmt.weights_frames(d),
            Phase.WARMUP: logfmt.runtime_frames(d),
            Phase.READY: logfmt.runtime_frames(d),
        }.get(self.phase, logfmt.init_frames(d))
        self._scheduler_crash(r, logfmt.traceback_text(frames, error))

    def _wait_for_nodes(self) -> None:
        """Node 0: the collectives after capture wait for every node's schedulers."""
        while self.fabric is not None and not self.fabric.all_joined():
            self._sleep(0.02)

    def _bind_host(self) -> str:
        """--host, with this sim host's own loopback address standing for 127.0.0.1."""
        host = self.flags.host
        if self.host.loopback and host in ("127.0.0.1", "localhost"):
            return self.host.loopback
        return host

    def _serve_as_follower(self) -> NoReturn:
        """Node >= 1 after its schedulers are ready: SGLang's engine joins them, installs (on
        0.5.23) the SIGTERM handler that only logs, serves the dummy /health and blocks until
        the schedulers exit: on node 0's ShutdownReq (exit 0) or a peer's death (the tree
        dies, 137)."""
        fabric = self.fabric
        assert fabric is not None
        fabric.join()
        self._joined = True
        self.phase = Phase.READY
        host, port = self._bind_host(), self.flags.port
        try:
            httpd = serve_dummy_health(host, port)
        except OSError as exc:
            self.log.record(None, f"Dummy health check server failed to start: {exc}", ERROR)
            self._forever.wait()
            raise AssertionError("unreachable") from None
        self.log.record(None, DUMMY_STARTED.format(host=self.flags.host, port=port))
        while not fabric.shutdown.is_set():
            self._sleep(0.02)
        httpd.shutdown()
        self.log.record(None, DUMMY_STOPPED.format(host=self.flags.host, port=port))
        self._dying = True
        self._release()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    def _nccl_crash(self) -> NoReturn:
        d = self.d
        r = self.ranks[0]
        if self.phase is Phase.CUDA_GRAPH:
            message = logfmt.NCCL_ERROR.split(": ", 1)[1]
            inner = logfmt.traceback_text(logfmt.capture_inner_frames(d), logfmt.NCCL_ERROR)
            outer = logfmt.traceback_text(
                logfmt.capture_outer_frames(d),
                "Exception: " + logfmt.capture_failed(d, message),
            )
            self._scheduler_crash(r, logfmt.chained(inner, outer))
        frames = {
            Phase.WEIGHTS: logfmt.weights_frames(d),
            Phase.WARMUP: logfmt.runtime_frames(d),
        }.get(self.phase, logfmt.init_frames(d))  # init and the KV pool's all-reduce
        self._scheduler_crash(r, logfmt.traceback_text(frames, logfmt.NCCL_ERROR))

    def _weights_phase(self) -> None:
        d, log, trace = self.d, self.log, self._trace()
        duration = self._enter(Phase.WEIGHTS)
        for r in self.ranks:
            log.record(
                r.label,
                "Load weight begin. avail mem="
                f"{logfmt.gb(self._avail(r, trace.pre_load_free_gib))} GB",
            )
        if not d.since(0, 5, 23):
            for r in self.ranks:
                log.record(r.label, "Using model weights format ['*.safetensors']")
        self._due()
        shards = self.scenario.shard_allocations()
        n = len(shards)
        desc = "Loading safetensors checkpoint shards"
        step_nominal = self._nominal(Phase.WEIGHTS) / n
        log.bar(logfmt.shard_bar(desc, 0, n, 0.0))
        fail = trace.failure
        for i, (alloc, _after) in enumerate(shards):
            self._wait(duration / n)
            if fail is not None and fail.phase is Phase.WEIGHTS and fail.step == i:
                log.end_bar()
                r = self.busiest
                tb = logfmt.traceback_text(
                    logfmt.weights_frames(d),
                    self._oom(r, fail.tried_gib or alloc, fail.free_gib or 0.0),
                )
                self._scheduler_crash(r, tb)
            self._allocate(alloc)
            log.bar(logfmt.shard_bar(desc, i + 1, n, step_nominal * (i + 1)))
        log.bar(logfmt.shard_bar(desc, n, n, step_nominal * n), close=True)
        self._due(final=True)
        post = trace.post_weights_free_gib or 0.0
        for r in self.ranks:
            log.record(
                r.label,
                logfmt.weight_end(
                    d,
                    elapsed_s=self._nominal(Phase.WEIGHTS),
                    arch=self.model.arch,
                    dtype=self._dtype(),
                    quant=self.flags.quantization,
                    avail_gib=self._avail(r, post),
                    usage_gib=self.scenario.weights_per_rank_gib,
                ),
            )

    def _lora_phase(self) -> None:
        """The LoRA manager, right after the target's weights (``maybe_init_lora_manager``):
        its backend line, then its memory pool, which the KV pool's sizing then sees gone."""
        gib = self.scenario.lora_gib
        if self.lora is None:
            return
        for r in self.ranks:
            self.log.record(r.label, "Using csgmv as backend of LoRA kernels.")
        fail = self._trace().failure
        if fail is not None and fail.kind == "lora_pool":
            self._enter(Phase.KV_CACHE)
            r = self.busiest
            tb = logfmt.traceback_text(logfmt.init_frames(self.d),
                                       self._oom(r, fail.tried_gib or gib, fail.free_gib or 0.0))
            self._scheduler_crash(r, tb)
        self._allocate(gib)

    def _dtype(self) -> str:
        dtype = self.model.torch_dtype if self.flags.dtype == "auto" else self.flags.dtype
        return "torch." + {"half": "float16", "float": "float32"}.get(dtype, dtype)

    def _draft_weights_phase(self) -> None:
        """The draft model's weight load (0.5.23: right after the target's; up to 0.5.15: after
        the target's graphs), printed by every rank with the draft's class."""
        d, log, trace, spec = self.d, self.log, self._trace(), self.spec
        assert spec is not None
        duration = self._enter(Phase.WEIGHTS) * DRAFT_WEIGHTS_SHARE
        begin = trace.draft_begin_free_gib or 0.0
        for r in self.ranks:
            log.record(
                r.label, f"Load weight begin. avail mem={logfmt.gb(self._avail(r, begin))} GB"
            )
        self._due()
        self._wait(duration)
        fail = trace.failure
        if fail is not None and fail.draft and fail.phase is Phase.WEIGHTS:
            r = self.busiest
            tb = logfmt.traceback_text(
                logfmt.weights_frames(d), self._oom(r, fail.tried_gib or 0.0, fail.free_gib or 0.0)
            )
            self._scheduler_crash(r, tb)
        gib = self.scenario.spec.draft_weights_gib if self.scenario.spec is not None else 0.0
        self._allocate(gib)
        after = trace.draft_post_weights_free_gib or 0.0
        for r in self.ranks:
            log.record(
                r.label,
                logfmt.weight_end(
                    d,
                    elapsed_s=self._nominal(Phase.WEIGHTS) * DRAFT_WEIGHTS_SHARE,
                    arch=spec.draft_arch,
                    dtype=self._dtype(),
                    quant=self.flags.quantization,
                    avail_gib=self._avail(r, after),
                    usage_gib=gib,
                ),
            )

    def _draft_kv_phase(self) -> None:
        """Up to 0.5.15 the draft's own pool, with the target's #tokens, from the headroom."""
        trace = self._trace()
        self._enter(Phase.KV_CACHE)
        fail = trace.failure
        if fail is not None and fail.draft and fail.phase is Phase.KV_CACHE:
            r = self.busiest
            tb = logfmt.traceback_text(
                logfmt.kv_frames(self.d, value_error=False),
                self._oom(r, fail.tried_gib or 0.0, fail.free_gib or 0.0),
            )
            self._scheduler_crash(r, tb)
        self._draft_pool_lines()

    def _draft_pool_lines(self) -> None:
        log, trace = self.log, self._trace()
        pool = trace.draft_kv_pool_gib or 0.0
        for r in self.ranks:
            log.record(
                r.label,
                logfmt.kv_allocated(
                    self.d,
                    tokens=trace.kv_tokens or 0,
                    pool_gib=pool,
                    dtype=self._kv_dtype(),
                    mla=self.model.mla,
                ),
            )
        self._allocate(pool)
        for r in self.ranks:
            avail = self._avail(r, trace.draft_pool_end_free_gib or 0.0)
            log.record(r.label, f"Memory pool end. avail mem={logfmt.gb(avail)} GB")

    def _kv_phase(self) -> None:
        d, log, trace = self.d, self.log, self._trace()
        duration = self._enter(Phase.KV_CACHE)
        if not d.since(0, 5, 15):
            for r in self.ranks:
                log.record(r.label, f"Using KV cache dtype: {self._kv_dtype()}")
        self._due()
        self._wait(duration)
        fail = trace.failure
        if fail is not None and fail.phase is Phase.KV_CACHE and not fail.draft:
            self._kv_failure(fail)
        self._due(final=True)
        mamba = trace.mamba
        # resolve_max_num_reqs runs before the pools are built.
        if trace.mamba_capped and mamba is not None and self.scenario.hybrid is not None:
            for r in self.ranks:
                log.record(
                    r.label,
                    logfmt.mamba_capped_warning(
                        cap=trace.max_running_requests or 0,
                        size=mamba.max_mamba_cache_size,
                        ratio=self.scenario.hybrid.ratio(),
                    ),
                    WARNING,
                )
        if mamba is not None:
            for r in self.ranks:
                log.record(
                    r.label,
                    logfmt.mamba_allocated(
                        size=mamba.max_mamba_cache_size,
                        conv_gib=mamba.conv_gib,
                        ssm_gib=mamba.ssm_gib,
                        intermediate_ssm_gib=mamba.intermediate_ssm_gib,
                        intermediate_conv_gib=mamba.intermediate_conv_gib,
                    ),
                )
            self._allocate(mamba.total_gib)
        tokens = trace.kv_tokens or 0
        pool = trace.kv_pool_gib or 0.0
        for r in self.ranks:
            log.record(
                r.label,
                logfmt.kv_allocated(
                    d, tokens=tokens, pool_gib=pool, dtype=self._kv_dtype(), mla=self.model.mla
                ),
            )
        self._allocate(pool)
        for r in self.ranks:
            avail = self._avail(r, trace.pool_end_free_gib or 0.0)
            log.record(r.label, f"Memory pool end. avail mem={logfmt.gb(avail)} GB")
        if self.spec is not None and self.scenario.new_order:
            self._draft_pool_lines()

    def _kv_failure(self, fail: Failure) -> NoReturn:
        d, trace = self.d, self._trace()
        frames = logfmt.kv_frames(d, value_error=False)
        if fail.kind in ("hybrid_state_memory", "hybrid_too_small"):
            detail = fail.detail
            if fail.kind == "hybrid_state_memory":
                final = logfmt.hybrid_state_memory_error(
                    size=int(detail["max_mamba_cache_size"]),
                    rest_gib=detail["total_rest_gib"],
                    per_req_mib=detail["per_req_gib"] * 1024,
                )
                line, func = 3394, "_handle_max_mamba_cache"
            else:
                final = logfmt.hybrid_too_small_error(
                    size=int(detail["max_mamba_cache_size"]),
                    ratio=int(detail["mamba_ratio"]),
                    reqs=int(detail["max_num_reqs"]),
                )
                line, func = 3154, "resolve_max_num_reqs"
            frames = [
                *frames[:-1],
                (
                    f"{logfmt.SGLANG_DIR}/srt/mem_cache/kv_cache_configurator.py",
                    line,
                    func,
                    "raise RuntimeError(",
                ),
            ]
            self._scheduler_crash(self.ranks[0], logfmt.traceback_text(frames, final))
        pool = trace.kv_pool_gib or 0.0
        value_error = d.since(0, 5, 23) and pool <= 0
        if value_error:
            # SGLang states the fraction at which the pool would be 0 (not the minimum
            # token count): 1 - available/pre.
            # 0.5.23 measures after the draft's weights too ("draft weights are now counted").
            available = trace.draft_post_weights_free_gib or trace.post_weights_free_gib or 0.0
            stated = 1 - available / trace.pre_load_free_gib
            final = "ValueError: " + logfmt.weights_leave_no_kv(self.mfs, stated)
        else:
            final = "RuntimeError: " + logfmt.not_enough_memory(d, self.mfs)
        tb = logfmt.traceback_text(logfmt.kv_frames(d, value_error=value_error), final)
        self._scheduler_crash(self.ranks[0], tb)

    def _kv_dtype(self) -> str:
        kv = self.flags.kv_cache_dtype
        return self._dtype() if kv == "auto" else f"torch.{kv}"

    def _graph_phase(self, passes: list[PassTrace]) -> None:
        """Play capture passes in order: each one's begin line (its own avail mem), its bar,
        its end line; the failing pass ends in SGLang's capture failure."""
        if not passes:
            return
        duration = self._enter(Phase.CUDA_GRAPH)
        nominal = self._nominal(Phase.CUDA_GRAPH)
        share = 1 / len(passes)
        self._due()
        for p in passes:
            self._capture_pass(p, duration * share, nominal * share)
        self._due(final=True)

    def _capture_pass(self, p: PassTrace, duration: float, nominal: float) -> None:
        d, log, trace = self.d, self.log, self._trace()
        first = self.ranks[0]
        prefill = p.name in ("target_prefill", "draft_prefill")
        # 0.5.23 logs draft decode/extend on rank 0 only (log_info_on_rank0); its prefill
        # capture and everything up to 0.5.15 log on every rank.
        ranks = [first] if p.draft and not prefill and d.since(0, 5, 23) else self.ranks
        verify = p.name == "target_verify"
        passes = self.scenario.graph_passes(self.bs, trace.max_running_requests)
        gp = next(g for g in passes if g.name == p.name)
        for r in ranks:
            avail = self._avail(r, p.begin_free_gib)
            if prefill:
                lines = [
                    logfmt.prefill_graph_begin(tokens=p.sizes, avail_gib=avail, role=role(p.name))
                ]
            elif p.draft:
                lines = [
                    logfmt.draft_graph_begin(
                        d, p.name, bs=p.sizes, tokens_per_req=p.tokens_per_req, avail_gib=avail
                    )
                ]
            else:
                lines = logfmt.graph_begin(
                    d, bs=p.sizes, avail_gib=avail, tokens_per_req=p.tokens_per_req, verify=verify
                )
                if not d.since(0, 5, 15) and r is not first:
                    lines = lines[:1]  # "Capture cuda graph bs [...]" is rank 0 only
            for line in lines:
                log.record(r.label, line)
        compile_weights = [
            TORCH_COMPILE_SLOWDOWN
            if self.flags.enable_torch_compile
            and not prefill
            and b <= self.flags.torch_compile_max_bs
            else 1.0
            for b, _ in gp.allocations
        ]
        unit = duration / len(compile_weights)
        unit_nominal = nominal / len(compile_weights)
        total = len(gp.allocations)
        elapsed = 0.0
        desc = ""
        log.bar(logfmt.progress_bar(None, 0, total, 0.0))
        fail = trace.failure
        failing = fail is not None and fail.graph_pass == p.name
        for i, (b, free) in enumerate(p.steps):
            shown = logfmt.gb(self._avail(first, free))
            desc = (
                f"Capturing prefill shape (num_tokens={b} avail_mem={shown} GB)"
                if prefill
                else f"Capturing batches (bs={b} avail_mem={shown} GB)"
            )
            log.bar(logfmt.progress_bar(desc, i, total, elapsed))
            self._wait(unit * compile_weights[i])
            elapsed += unit_nominal * compile_weights[i]
            if failing and fail is not None and fail.step == i:
                log.end_bar()
                self._capture_oom(p.name, fail.tried_gib or 0.0, fail.free_gib or 0.0)
            self._allocate(gp.allocations[i][1], graph=True)
            log.bar(logfmt.progress_bar(desc, i + 1, total, elapsed))
        log.bar(logfmt.progress_bar(desc, total, total, elapsed), close=True)
        end = p.end_free_gib or 0.0
        usage = p.mem_gib or 0.0
        for r in ranks:
            avail = self._avail(r, end)
            if prefill:
                line = logfmt.prefill_graph_end(
                    elapsed_s=elapsed, usage_gib=usage, avail_gib=avail, role=role(p.name)
                )
            elif p.draft:
                line = logfmt.draft_graph_end(
                    d, p.name, elapsed_s=elapsed, usage_gib=usage, avail_gib=avail
                )
            else:
                line = logfmt.graph_end(
                    d,
                    bs=p.sizes,
                    elapsed_s=elapsed,
                    usage_gib=usage,
                    avail_gib=avail,
                    verify=verify,
                )
            log.record(r.label, line)

    def _capture_oom(self, name: str, tried: float, free: float) -> NoReturn:
        d = self.d
        r = self.busiest
        oom = self._oom(r, tried, free)
        if name in ("target_prefill", "draft_prefill"):
            # The breakable prefill backend logs and re-raises torch's error unwrapped.
            frames = [*logfmt.capture_outer_frames(d)[:-1], *logfmt.capture_inner_frames(d)[1:]]
            self._scheduler_crash(r, logfmt.traceback_text(frames, oom))
        if name.startswith("draft"):
            inner_frames = logfmt.draft_capture_inner_frames(d, name)
            outer_frames = logfmt.draft_capture_outer_frames(d, name)
        else:
            inner_frames = logfmt.capture_inner_frames(d)
            outer_frames = logfmt.capture_outer_frames(d)
        inner = logfmt.traceback_text(inner_frames, oom)
        outer = logfmt.traceback_text(
            outer_frames, "Exception: " + logfmt.capture_failed(d, oom.split(": ", 1)[1])
        )
        self._scheduler_crash(r, logfmt.chained(inner, outer))

    def _summary(self) -> None:
        trace = self._trace()
        tokens = trace.kv_tokens or 0
        mrr = (
            trace.max_running_requests
            or self.flags.max_running_requests
            or min(max(int(tokens / self.context_len * 512), 2048), 4096)
        )
        end = trace.graph_end_free_gib or trace.pool_end_free_gib or 0.0
        for r in self.ranks:
            if r.tp_rank == 0:
                self.log.record(
                    r.label,
                    logfmt.summary(
                        max_total_num_tokens=tokens,
                        chunked_prefill_size=self.chunk,
                        max_prefill_tokens=MAX_PREFILL_TOKENS,
                        max_running_requests=mrr,
                        context_len=self.context_len,
                        available_gib=self._avail(r, end),
                    ),
                )

    def _trace(self) -> StartupTrace:
        assert self.trace is not None, "the trace is computed in the init phase"
        return self.trace

    # -- serving ---------------------------------------------------------------------------

    def _serve(self) -> int:
        f, log = self.flags, self.log
        self.phase = Phase.WARMUP
        self._phase_t0 = time.monotonic()
        log.uvicorn(f"Started server process [{self.pid}]")
        log.uvicorn("Waiting for application startup.")
        warmup = threading.Thread(target=self._warmup, name="warmup", daemon=True)
        warmup.start()
        log.uvicorn("Application startup complete.")
        try:
            httpd = SimHttpServer((self._bind_host(), f.port), self)
        except OSError as exc:
            log.uvicorn(
                logfmt.bind_error(f.host, f.port, exc.errno or 0, exc.strerror or str(exc)), ERROR
            )
            log.uvicorn("Waiting for application shutdown.")
            self._stop_warmup.set()
            warmup.join(timeout=max(1.0, 30 * self.scale))
            log.uvicorn("Application shutdown complete.")
            self._dying = True
            self._release()
            return 3
        httpd.start()
        log.uvicorn(f"Uvicorn running on http://{f.host}:{f.port} (Press CTRL+C to quit)")
        pending = list(self.plan.after_ready)
        while True:
            self._sleep(0.02)
            now = time.monotonic()
            if self._sigterm_at is not None:
                self._drain(now)
            ready_at = self._ready_at
            while ready_at is not None and pending and now - ready_at >= pending[0].after_s:
                self._after_ready(pending.pop(0))

    def _warmup_url(self) -> str:
        host = self._bind_host()
        if self.d.since(0, 5, 10):
            host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.flags.port}"

    def _warmup(self) -> None:
        """The warmup thread: the warmup request, then the ready line (or the tree dies)."""
        if not self.flags.skip_server_warmup:
            timeout = float(os.environ.get("SGLANG_WARMUP_TIMEOUT") or -1)
            end, error = run_warmup(
                self._warmup_url(),
                model_info_path=self.d.model_info_path,
                api_key=self.api_key,
                poll_s=max(WARMUP_POLL_NOMINAL_S * self.scale, 0.001),
                generate_timeout_s=timeout if timeout > 0 else 600.0,
                freeze_gc=self.d.since(0, 5, 23),
                stop=self._stop_warmup,
            )
            if end is WarmupEnd.STOPPED:
                return
            if end is WarmupEnd.FAILED:
                self._warmup_failed(error)
        self._ready_at = time.monotonic()
        self.log.record(None, logfmt.READY)

    def _warmup_failed(self, last: str) -> NoReturn:
        self.log.record(None, f"Initialization failed. warmup error: {last}", ERROR)
        self._kill_tree()

    def _after_ready(self, fault: Fault) -> None:
        if fault.kind is FaultKind.DIE_SILENTLY:
            self._sigkill_self()
        if fault.kind is FaultKind.HANG_AFTER_READY:
            self._hung = True
            self.log.silenced = True
            return
        if fault.kind is FaultKind.CRASH_AFTER_READY:
            final = fault.message or logfmt.CUDA_ILLEGAL_ACCESS
            self._scheduler_crash(
                self.ranks[0], logfmt.traceback_text(logfmt.runtime_frames(self.d), final)
            )
        if fault.kind is FaultKind.OOM_RUNTIME:
            r = self.busiest
            free = self.host.gpu_total_gib - r.others_gib - r.used_gib
            tried = max(free, 0.0) + max(self.scenario.warmup_gib, 0.5)
            tb = logfmt.traceback_text(logfmt.runtime_frames(self.d), self._oom(r, tried, free))
            self._scheduler_crash(r, tb)

    # -- signals ---------------------------------------------------------------------------

    def _on_sigterm(self, signum: int, frame: object) -> None:
        if self.node_rank > 0 and self._joined and self.d.since(0, 5, 23):
            # engine.py: nodes >= 1 cannot drain; rank 0's ShutdownReq stops them.
            self.log.record(None, SIGTERM_IGNORED.format(rank=self.node_rank), WARNING)
            return
        if self._ready_at is None:
            # SGLang has no handler while loading: the process dies at once.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if self._sigterm_at is None:
            self.log.record(None, logfmt.sigterm_received(), WARNING)
            self._sigterm_at = time.monotonic()
            self._next_drain = self._sigterm_at + DRAIN_POLL_NOMINAL_S * self.scale

    def _drain(self, now: float) -> None:
        """SGLang's ``sigterm_watchdog``: force exit, or wait for in-flight requests. Node 0
        of a multi-node server broadcasts ShutdownReq to the other nodes as it goes."""
        if self._next_drain is None or now < self._next_drain:
            return
        if self.fabric is not None:
            self.fabric.broadcast_shutdown()
        if self._unhealthy:
            self.log.record(
                None, "Signal SIGTERM received while health check failed. Force exiting.", ERROR
            )
            self._kill_tree()
        if os.environ.get("SGL_FORCE_SHUTDOWN", "").lower() in ("1", "true", "yes"):
            self.log.record(
                None, "Signal SIGTERM received while force shutdown flag set. Force exiting.", ERROR
            )
            self._kill_tree()
        with self._lock:
            remaining = self._inflight
        rids = [f"req-{i}" for i in range(remaining)]
        self.log.record(
            None,
            f"Gracefully exiting... Remaining number of requests {remaining}. "
            f"Remaining requests remaining_rids={rids}.",
        )
        if remaining == 0:
            self._kill_tree()
        self._next_drain = now + DRAIN_POLL_NOMINAL_S * self.scale

    # -- HttpBackend -----------------------------------------------------------------------

    def status(self) -> SimServerState:
        if self._sigterm_at is not None:
            return SimServerState.SHUTTING_DOWN
        if self._unhealthy:
            return SimServerState.UNHEALTHY
        return SimServerState.UP if self._ready_at is not None else SimServerState.STARTING

    def health(self) -> int:
        if self._hung and self.status() is SimServerState.UP:
            self._unhealthy = True
            now = time.strftime("%H:%M:%S")
            self.log.record(
                None,
                "Health check failed. Server couldn't get a response from "
                f"detokenizer for last 20 seconds. tic start time: {now}. "
                f"last_heartbeat time: {now}",
                ERROR,
            )
        return 200 if self.status() is SimServerState.UP else 503

    def info(self) -> ApiInfo:
        trace = self._trace()
        return ApiInfo(
            version=self.d.version,
            model_path=self.flags.model_path,
            served_model_name=self.flags.served_model_name,
            model_type=self.model.model_type,
            arch=self.model.arch,
            load_format=self.flags.load_format,
            context_len=self.context_len,
            server_args=self._args_items(),
            max_total_num_tokens=trace.kv_tokens or 0,
            weights_gib=self.scenario.weights_per_rank_gib,
            kv_cache_gib=trace.kv_pool_gib or 0.0,
            graph_gib=trace.graph_mem_gib or 0.0,
        )

    def scheduler_round_trip(self) -> None:
        if self._hung:
            self._forever.wait()

    def running_requests(self) -> int:
        with self._lock:
            return self._inflight

    def deprecated_path(self, path: str, replacement: str) -> None:
        if self.d.since(0, 5, 10):
            self.log.record(
                None,
                f"Endpoint '{path}' is deprecated and will be removed in a "
                f"future version. Please use '{replacement}' instead.",
                WARNING,
            )

    def access(self, client: str, request_line: str, code: int) -> None:
        self.log.uvicorn(f'{client} - "{request_line}" {code} {reason(code)}', access=True)

    def generate(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self._inflight += 1
            first = not self._served_any
            self._served_any = True
        try:
            return self._generate(request, first=first)
        finally:
            with self._lock:
                self._inflight -= 1

    def _generate(self, request: dict[str, Any], *, first: bool) -> dict[str, Any]:
        if self._hung:
            self._forever.wait()
        warmup = first and self._ready_at is None
        if warmup:
            fault = self.plan.in_phase(Phase.WARMUP)
            if fault is not None:
                time.sleep(fault.after_s)
                if fault.kind is FaultKind.HANG:
                    self._forever.wait()
                self._fire(fault)
        text = str(request.get("text") or "")
        params = request.get("sampling_params") or {}
        max_new = int(params.get("max_new_tokens", 8)) if isinstance(params, dict) else 8
        prompt_tokens = len(text.split()) + 1
        self.log.record(self.ranks[0].label, logfmt.prefill_batch(self.d, new_tokens=prompt_tokens))
        if warmup:
            time.sleep(max(self._nominal(Phase.WARMUP) - WARMUP_POLL_NOMINAL_S, 0) * self.scale)
        else:
            time.sleep(GENERATE_NOMINAL_S * self.scale)
        if first:
            # The first prefill allocates the activations SGLang's warmup exists to check.
            fail = self._trace().failure
            if fail is not None and fail.phase is Phase.WARMUP:
                r = self.busiest
                tb = logfmt.traceback_text(
                    logfmt.runtime_frames(self.d),
                    self._oom(r, fail.tried_gib or 0.0, fail.free_gib or 0.0),
                )
                self._scheduler_crash(r, tb)
            self._allocate(self.scenario.warmup_gib)
        words = ["", "Paris.", "It", "is", "the", "largest", "city", "in", "France"]
        return {
            "text": " ".join(words[: max_new + 1]),
            "meta_info": {
                "id": f"{random.getrandbits(64):016x}",
                "finish_reason": {"type": "length", "length": max_new},
                "prompt_tokens": prompt_tokens,
                "completion_tokens": max_new,
                "cached_tokens": 0,
            },
        }


# ---------------------------------------------------------------------------------------------
# Entry point


def _fail(text: str, code: int = 1) -> int:
    sys.stderr.write(text if text.endswith("\n") else text + "\n")
    sys.stderr.flush()
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Run one simulated server with ``argv`` (default: sys.argv[1:]); returns its exit status
    when it exits rather than dying by a signal (argparse errors exit 2 from inside)."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        d = Dialect(os.environ.get(ENV_VERSION) or DEFAULT_VERSION)
    except ValueError as exc:
        return _fail(f"launcher.sim: {exc}")
    if d.since(0, 5, 23):
        sys.stderr.write(logfmt.LAUNCH_WARNING)
    flags = Flags.parse(d, args)
    log = LogWriter(
        level=logfmt.LEVELS.get(flags.log_level.lower(), INFO),
        ms=bool(os.environ.get("SGLANG_LOG_MS")),
    )
    try:
        plan = FaultPlan.from_env()
        host = SimGpuHost.from_env()
    except (FaultProfileError, HostConfigError) as exc:
        return _fail(f"launcher.sim: {exc}")
    try:
        if host is None:
            raise ConfigFailure(logfmt.no_accelerator_error())
        model = load_model(flags.model_path, flags.revision)
        _check_context_length(flags, model)
        spec = resolve_speculative(flags, model, d) if flags.speculative_algorithm else None
        hybrid = resolve_hybrid(flags, model, d, spec)
        lora = resolve_lora_shape(flags, model, d)
    except ConfigFailure as exc:
        return _fail(exc.text)
    return Server(flags, d, host, model, plan, log, spec=spec, hybrid=hybrid, lora=lora).run()


def _check_context_length(flags: Flags, model: ModelSpec) -> None:
    if (
        flags.context_length is not None
        and flags.context_length > model.max_position_embeddings
        and os.environ.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN") != "1"
    ):
        raise ConfigFailure(
            logfmt.config_error(
                f"ValueError: Warning: User-specified context_length ({flags.context_length}) is "
                f"greater than the derived context_length ({model.max_position_embeddings}). This "
                "may lead to incorrect model outputs or CUDA errors. Note that the derived "
                "context_length may differ from max_position_embeddings in the model's config. "
                "To allow overriding this maximum, set the env var "
                "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"
            )
        )


if __name__ == "__main__":
    sys.exit(main())

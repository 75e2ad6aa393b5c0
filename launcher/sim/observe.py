"""What the log of a simulated start-up shows, read the way the classifier reads a real one.

``observed`` turns a :class:`~launcher.sim.memory.StartupTrace` into the (outcome, phase,
numbers) triple that the log classifier would produce from SGLang's output for that start-up;
only figures SGLang actually prints before the failure are filled in, rounded as SGLang
prints them (GiB to 2 decimals, ``mem_fraction_static`` to 3).

``run_policy`` drives the loop simulate -> observed -> ``next_params`` for one scenario; the
property tests and the benchmark script share it.
"""

from __future__ import annotations

from launcher.memory.policy import AttemptRecord, Bounds, next_params
from launcher.params import LaunchParams
from launcher.sglang.logparse import parse_size_gib
from launcher.sglang.outcome import Numbers, Outcome
from launcher.sglang.phases import Phase
from launcher.sglang.versions import MAMBA_RADIX_SPELLING_FROM, STATED_MINIMUM_FROM, at_least
from launcher.sim.logfmt import format_size
from launcher.sim.memory import MemoryScenario, StartupTrace, simulate

# 0.5.23's kv_cache_configurator says "Loaded weights leave no GPU memory ... minimum viable =
# 1 - available/pre = X"; older versions only say "Not enough memory" with the current value.


def _gib(value: float) -> float:
    return round(value, 2)


def _torch_gib(value: float) -> float:
    """A size as torch's OOM message prints it (``format_size``: bytes, KiB, MiB or GiB to two
    decimals), read back as the classifier reads it: 8 MiB is 0.0078125, not 0.01."""
    number, unit = format_size(value).split()
    gib = parse_size_gib(number, unit)
    assert gib is not None, number  # format_size prints a few digits
    return gib


def observed(scenario: MemoryScenario, trace: StartupTrace) -> tuple[Outcome, Phase, Numbers]:
    """The classifier's reading of the log SGLang prints for ``trace``.

    Contract, by how far the start-up got:

    - always: the resolved ``mem_fraction_static`` / ``cuda_graph_max_bs`` (server_args dump);
    - weight load began (``Load weight begin. avail mem=``): ``pre_load_avail_gib``;
    - weights loaded: ``post_weights_avail_gib`` and ``weights_gib`` (per rank "mem usage");
    - KV pool allocated (a pool > 0): ``kv_tokens``; pool done: ``pool_end_avail_gib``;
    - capture began: ``graph_begin_avail_gib`` of the last capture pass begun (its
      ``Capture ... begin ... avail mem`` line; earlier passes' lines do not count) and that
      pass's last progress line, which SGLang prints before each capture step (``graph_last_*``,
      ``graph_steps_done`` = the steps finished before it, ``graph_steps_total`` = its sizes);
    - speculative decoding (server_args dump): algorithm, steps, topk, draft tokens and the
      resolved ``max_running_requests``; the resolved ``mamba_strategy`` (from 0.5.10 on,
      every model); the draft's ``Load weight end`` (``draft_weights_gib``) and the ``Mamba
      Cache is allocated`` line (``mamba_cache_size``, ``mamba_state_gib``) once printed; the
      capture passes
      (``graph_pass`` of the last begin line, ``graph_first_begin_avail_gib``,
      ``graph_passes_begun``, every begin line's ``graph_begins``, the ``end`` lines'
      ``graph_passes_ended``); the draft pool's ``KV Cache is allocated`` line
      (``draft_kv_gib``); 0.5.23's hybrid state errors' ``max_mamba_cache_size`` and
      ``mamba_cache_per_req``;
    - any CUDA OOM: ``tried_gib``, ``free_gib``, ``total_gib`` from torch's message, in its
      units (``format_size``: a figure under 1 GiB is printed in MiB to 2 decimals);
    - a 0.5.10 draft weight or pool OOM after the target's graphs: ``oom_graph_capture`` in
      the ``cuda_graph`` phase (the phase never goes back to weights or the KV cache);
    - kv_too_small with a pool <= 0 on SGLang >= 0.5.23: ``min_mem_fraction`` as stated
      (4 decimals, ``1 - post_weights/pre``); never for 0.5.6's "Not enough memory";
    - past capture (warmup failure, ready): ``max_total_num_tokens`` from the TP0 summary.
    """
    fail = trace.failure
    numbers = Numbers(
        mem_fraction_static=round(trace.mem_fraction_static, 3),
        cuda_graph_max_bs=trace.cuda_graph_max_bs,
    )
    spec = scenario.spec
    if spec is not None:  # the server_args dump (and "reset to 48 for speculative decoding")
        numbers.speculative_algorithm = spec.algorithm
        numbers.speculative_num_steps = spec.num_steps
        numbers.speculative_eagle_topk = spec.topk
        numbers.speculative_num_draft_tokens = spec.num_draft_tokens
        numbers.max_running_requests = spec.max_running_requests
    elif scenario.max_running_requests is not None:
        numbers.max_running_requests = scenario.max_running_requests
    # The dump always carries the strategy: 0.5.10 resolves ``auto`` to ``no_buffer`` for
    # every model (server_args.py:964-967); later versions keep ``auto`` for non-hybrids.
    if scenario.hybrid is not None:
        numbers.mamba_strategy = scenario.hybrid.strategy
    elif at_least(scenario.sglang_version, MAMBA_RADIX_SPELLING_FROM):
        numbers.mamba_strategy = "auto"
    elif at_least(scenario.sglang_version, (0, 5, 10)):
        numbers.mamba_strategy = "no_buffer"
    pre = trace.pre_load_free_gib
    if fail is None or fail.phase is not Phase.INIT:
        numbers.pre_load_avail_gib = _gib(pre)
    post = trace.post_weights_free_gib
    if post is not None:
        numbers.post_weights_avail_gib = _gib(post)
        numbers.weights_gib = _gib(pre - post)
    draft_begin, draft_end = trace.draft_begin_free_gib, trace.draft_post_weights_free_gib
    if draft_begin is not None and draft_end is not None:  # the draft's "Load weight end"
        numbers.draft_weights_gib = _gib(draft_begin - draft_end)
    # "Mamba Cache is allocated. max_mamba_cache_size: N, ..." is printed when the pool is
    # built, after resolve_max_num_reqs: never before "too small to serve any requests".
    printed = fail is None or fail.kind != "hybrid_too_small"
    if trace.mamba is not None and printed:
        numbers.mamba_cache_size = trace.mamba.max_mamba_cache_size
        numbers.mamba_state_gib = _gib(trace.mamba.total_gib)
    if trace.kv_pool_gib is not None and trace.kv_pool_gib > 0:
        numbers.kv_tokens = trace.kv_tokens
    if spec is not None and trace.draft_kv_pool_gib is not None:  # the second KV line
        numbers.draft_kv_gib = _gib(trace.draft_kv_pool_gib)
    if trace.pool_end_free_gib is not None:
        numbers.pool_end_avail_gib = _gib(trace.pool_end_free_gib)
    if trace.passes:
        # The last "Capture ... begin" line names the pass; the bar is that pass's.
        last = trace.passes[-1]
        numbers.graph_begin_avail_gib = _gib(last.begin_free_gib)
        if scenario.spec is not None or scenario.hybrid is not None or (
            scenario.prefill_graph_gib > 0
        ):
            # The pass names, as the classifier reads them, only for scenarios with several
            # capture passes (speculative, hybrid, 0.5.23's prefill graphs). Plain scenarios
            # (the plain OOM convergence benchmark, the property tests) keep the reading
            # without them, so that their figures stay comparable with docs/benchmarks.md's.
            numbers.graph_first_begin_avail_gib = _gib(trace.passes[0].begin_free_gib)
            numbers.graph_pass = last.name
            numbers.graph_passes_begun = len(trace.passes)
            numbers.graph_begins = [(p.name, _gib(p.begin_free_gib)) for p in trace.passes]
            numbers.graph_passes_ended = sum(p.end_free_gib is not None for p in trace.passes)
        last_bs, last_free = last.steps[-1]
        numbers.graph_last_avail_gib = _gib(last_free)
        numbers.graph_last_bs = last_bs
        numbers.graph_steps_done = len(last.steps) - 1
        numbers.graph_steps_total = len(last.sizes)
    if trace.graph_end_free_gib is not None:
        numbers.max_total_num_tokens = trace.kv_tokens
    if fail is None:
        return Outcome.READY, Phase.READY, numbers
    outcome, phase = fail.outcome, fail.phase
    if fail.kind in ("hybrid_state_memory", "hybrid_too_small"):
        # The simulated server prints 0.5.23's own RuntimeError for these, which the classifier
        # reads as hybrid_state_too_small (not as the generic "Not enough memory").
        outcome = Outcome.HYBRID_STATE_TOO_SMALL
    if fail.draft and trace.passes and not scenario.new_order:
        # 0.5.10 loads the draft's weights and pool after the target's graphs; phases only
        # move forward, so the classifier reads that OOM in the capture phase (checked against
        # the simulated server's log: a draft pool OOM is oom_graph_capture / cuda_graph).
        outcome, phase = Outcome.OOM_GRAPH_CAPTURE, Phase.CUDA_GRAPH
    if fail.tried_gib is not None and fail.free_gib is not None:
        numbers.tried_gib = _torch_gib(fail.tried_gib)
        numbers.free_gib = _torch_gib(fail.free_gib)
        numbers.total_gib = _torch_gib(scenario.gpu_total_gib)
    if fail.kind == "hybrid_state_memory":  # 0.5.23's "Not enough GPU memory for hybrid ..."
        numbers.mamba_cache_size = int(fail.detail["max_mamba_cache_size"])
        numbers.mamba_per_req_mib = round(fail.detail["per_req_gib"] * 1024, 2)
    elif fail.kind == "hybrid_too_small":
        numbers.mamba_cache_size = int(fail.detail["max_mamba_cache_size"])
    pool = trace.kv_pool_gib
    if (
        fail.outcome is Outcome.KV_TOO_SMALL
        and pool is not None
        and pool <= 0
        and post is not None
        and at_least(scenario.sglang_version, STATED_MINIMUM_FROM)
    ):
        # 0.5.23 loads the draft before sizing the pool: its "available" is after both.
        available = trace.draft_post_weights_free_gib or post
        numbers.min_mem_fraction = round(1 - available / pre, 4)
    return outcome, phase, numbers


def run_policy(
    scenario: MemoryScenario,
    initial: LaunchParams,
    bounds: Bounds,
) -> list[AttemptRecord]:
    """Launch ``initial`` in the simulator and follow ``next_params`` until ready or give-up.

    Returns every attempt in order; the last one is READY, or the policy gave up after it
    (``next_params`` on the returned history then says why). At most ``bounds.max_attempts``
    attempts, since the policy gives up there.
    """
    history: list[AttemptRecord] = []
    params: LaunchParams | None = initial
    while params is not None:
        trace = simulate(scenario, params)
        outcome, phase, numbers = observed(scenario, trace)
        history.append(AttemptRecord(params, outcome, phase, numbers))
        if outcome is Outcome.READY:
            break
        decision = next_params(
            initial, bounds, history, tp=scenario.tp, sglang_version=scenario.sglang_version
        )
        params = decision.params
    return history

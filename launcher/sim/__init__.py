"""A simulated SGLang GPU host, used by the demo and the tests in place of real GPUs.

    python -m launcher.sim.server <SGLang flags>      a simulated ``sglang.launch_server``
    python -m launcher.sim.nvidia_smi <args>          nvidia-smi for the simulated host

Environment:

    SGLANG_SIM_HOST        host JSON (GPU count and size, state dir, time scale, foreign use)
    SGLANG_SIM_VERSION     emulated SGLang version: 0.5.6, 0.5.10, 0.5.15, 0.5.23 (default)
    SGLANG_SIM_FAULTS      fault profile JSON (see launcher.sim.faults)
    SGLANG_SIM_TIME_SCALE  overrides the host's time scale
    LAUNCHER_ATTEMPT       attempt number a fault's "attempts" list is matched against

SGLang's own variables the simulator honours: SGLANG_ENABLE_SPEC_V2 (0.5.10: spec v2 on, and its
topk = 1 check), SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH (0.5.23: no draft extend graph),
SGLANG_WARMUP_TIMEOUT, SGLANG_LOG_MS, SGL_FORCE_SHUTDOWN,
SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN. Hugging Face's: HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE,
HF_HOME, XDG_CACHE_HOME (where the HF cache is), HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE.

A --model-path, --speculative-draft-model-path or --lora-paths adapter that is not a directory
but a Hub id (``org/name``) is read from its snapshot in the HF cache at --revision
(--speculative-draft-model-revision for the draft; default main), as transformers and
huggingface_hub resolve it when the Hub cannot be reached: the simulator has no network. Not in
the cache, it fails where SGLang does, with their error text (see ``hub``).

Speculative decoding (--speculative-algorithm EAGLE/EAGLE3/NEXTN with a draft from
--speculative-draft-model-path or the model's built-in MTP head) and hybrid Mamba models
(the model's ``sim.hybrid``) follow each version's start-up order and memory arithmetic; see
``memory`` and ``server``.

Modules: ``memory`` (the start-up memory arithmetic), ``server`` (the process: phases,
failures, shutdown), ``cmdline`` (its flags), ``model`` (config.json and the flags as a
memory scenario), ``logfmt`` (SGLang's lines per version), ``http`` (endpoints and the
warmup client), ``gpustate`` (GPU occupancy shared between processes), ``faults``,
``nvidia_smi``, ``hub`` (Hub ids in the HF cache). This package's ``__init__`` imports
nothing: the scheduler stand-ins that the server spawns import ``gpustate`` at start-up and
must stay cheap.
"""

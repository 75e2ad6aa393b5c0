"""A simulated SGLang GPU host, used by the demo and the tests in place of real GPUs.

    python -m launcher.sim.server <SGLang flags>      a simulated ``sglang.launch_server``
    python -m launcher.sim.nvidia_smi <args>          nvidia-smi for the simulated host

Environment:

    SGLANG_SIM_HOST        host JSON (GPU count and size, state dir, time scale, foreign use)
    SGLANG_SIM_VERSION     emulated SGLang version: 0.5.6, 0.5.10, 0.5.15, 0.5.23 (default)
    SGLANG_SIM_FAULTS      fault profile JSON (see launcher.sim.faults)
    SGLANG_SIM_TIME_SCALE  overrides the host's time scale
    LAUNCHER_ATTEMPT       attempt number a fault's "attempts" list is matched against

Modules: ``memory`` (the start-up memory arithmetic), ``server`` (the process: flags, phases,
failures, shutdown), ``logfmt`` (SGLang's lines per version), ``http`` (endpoints and the
warmup client), ``gpustate`` (GPU occupancy shared between processes), ``faults``,
``nvidia_smi``. This package's ``__init__`` imports nothing: the scheduler stand-ins that the
server spawns import ``gpustate`` at start-up and must stay cheap.
"""

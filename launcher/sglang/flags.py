"""The SGLang flags launcher owns, and how each is spelled per version.

One table serves the three uses: ``config`` refuses an owned flag in ``extra_args``
(:data:`OWNED_FLAGS`), ``command`` writes the params' flags in a version's dialect
(:func:`params_argv`, through :func:`graph_bs_flag` and :func:`mamba_strategy_flag`), and
adoption reads them back from an attempt's recorded argv and env file
(:func:`params_from_argv`, :data:`PARAM_FLAGS`, :data:`PARAMS_ENV`). Pure: no I/O.
"""

from __future__ import annotations

import itertools
import re
import shlex
from collections.abc import Collection, Iterable

from launcher.params import LaunchParams
from launcher.sglang.versions import (
    DECODE_SPELLING_FROM,
    MAMBA_RADIX_SPELLING_FROM,
    SPEC_V2_ENV_REMOVED_FROM,
    at_least,
)
from launcher.untrusted import MASK

__all__ = [
    "OWNED_FLAGS",
    "PARAMS_ENV",
    "PARAM_FLAGS",
    "PARAM_SWITCHES",
    "PARAM_TYPES",
    "SECRET_ARG_ENV",
    "SECRET_FLAGS",
    "SPEC_V2_ENV",
    "env_is_read",
    "full_flag",
    "graph_bs_flag",
    "hidden_args_argv",
    "is_secret_flag",
    "mamba_strategy_flag",
    "mask_secret_flags",
    "mask_secret_flags_text",
    "params_argv",
    "params_from_argv",
]

# Every spelling (all versions) of a flag whose value launcher decides, and the config field
# that sets it. Order matters: an argparse abbreviation ("--mem-frac") is the first owned flag
# it prefixes.
OWNED_FLAGS: dict[str, str] = {
    "--model-path": "model_path",
    "--model": "model_path",
    "--served-model-name": "served_model_name",
    "--tp": "tp",
    "--tp-size": "tp",
    "--tensor-parallel-size": "tp",
    "--dp": "dp",
    "--dp-size": "dp",
    "--data-parallel-size": "dp",
    "--port": "port",
    "--host": "listen",
    "--mem-fraction-static": "mem_fraction_static",
    "--cuda-graph-max-bs": "cuda_graph_max_bs",
    "--cuda-graph-max-bs-decode": "cuda_graph_max_bs",
    "--cuda-graph-max-bs-prefill": "cuda_graph_max_bs",
    "--max-running-requests": "max_running_requests",
    "--max-mamba-cache-size": "max_mamba_cache_size",
    "--mamba-full-memory-ratio": "mamba_full_memory_ratio",
    "--mamba-scheduler-strategy": "mamba_strategy",
    "--mamba-radix-cache-strategy": "mamba_strategy",
    "--disable-overlap-schedule": "disable_overlap_schedule",
    # Multi-node: launcher writes them per rank from nodes / dist_init_port / dist_init_addr
    # (same spelling in 0.5.10 and 0.5.23; --nccl-init-addr is an alias of --dist-init-addr).
    "--nnodes": "nodes",
    "--node-rank": "nodes",
    "--dist-init-addr": "dist_init_addr",
    "--nccl-init-addr": "dist_init_addr",
    "--gated-launch-port": "gated_launch_port",
}

# The ``LaunchParams`` fields launcher sets per attempt, and the type of each flag's value.
PARAM_TYPES: dict[str, type[float] | type[int] | type[str]] = {
    "mem_fraction_static": float,
    "cuda_graph_max_bs": int,
    "max_running_requests": int,
    "max_mamba_cache_size": int,
    "mamba_full_memory_ratio": float,
    "mamba_strategy": str,
}

# The ``LaunchParams`` fields that are switches: a flag with no value, written when True.
PARAM_SWITCHES: dict[str, str] = {
    "disable_overlap_schedule": "--disable-overlap-schedule",
}

# The spellings (either dialect) launcher writes for a ``LaunchParams`` field: the owned flags
# of those fields, less the prefill graph bs, which launcher never sets.
PARAM_FLAGS: dict[str, str] = {
    flag: field
    for flag, field in OWNED_FLAGS.items()
    if field in PARAM_TYPES and flag != "--cuda-graph-max-bs-prefill"
}


def graph_bs_flag(sglang_version: str) -> str:
    """The flag that sets the decode CUDA-graph max batch size in ``sglang_version``."""
    if at_least(sglang_version, DECODE_SPELLING_FROM):
        return "--cuda-graph-max-bs-decode"
    return "--cuda-graph-max-bs"


def mamba_strategy_flag(sglang_version: str) -> str:
    """The flag that sets the hybrid (Mamba) radix-cache strategy in ``sglang_version``."""
    if at_least(sglang_version, MAMBA_RADIX_SPELLING_FROM):
        return "--mamba-radix-cache-strategy"
    return "--mamba-scheduler-strategy"


# SGLANG_ENABLE_SPEC_V2 was retired by PR #27964; 0.5.23 has no reference to it and ignores it.
SPEC_V2_ENV = "SGLANG_ENABLE_SPEC_V2"


def env_is_read(name: str, sglang_version: str) -> bool:
    """False for an environment variable ``sglang_version`` no longer reads (set it or not)."""
    if name == SPEC_V2_ENV:
        return not at_least(sglang_version, SPEC_V2_ENV_REMOVED_FROM)
    return True


# --- params <-> argv ---------------------------------------------------------------------


def params_argv(params: LaunchParams, sglang_version: str) -> list[str]:
    """The flags ``params`` set, in the dialect of ``sglang_version`` (None fields: none)."""
    argv: list[str] = []
    if params.mem_fraction_static is not None:
        argv += ["--mem-fraction-static", f"{params.mem_fraction_static:.3f}".rstrip("0")]
    if params.cuda_graph_max_bs is not None:
        argv += [graph_bs_flag(sglang_version), str(params.cuda_graph_max_bs)]
    if params.max_running_requests is not None:
        argv += ["--max-running-requests", str(params.max_running_requests)]
    if params.mamba_strategy is not None:
        argv += [mamba_strategy_flag(sglang_version), params.mamba_strategy]
    if params.max_mamba_cache_size is not None:
        argv += ["--max-mamba-cache-size", str(params.max_mamba_cache_size)]
    if params.mamba_full_memory_ratio is not None:
        argv += ["--mamba-full-memory-ratio", f"{params.mamba_full_memory_ratio:g}"]
    if params.disable_overlap_schedule:
        argv.append(PARAM_SWITCHES["disable_overlap_schedule"])
    return argv


# Environment variables a relaunch's params may set (``LaunchParams.env``), recovered from an
# adopted attempt's env file.
PARAMS_ENV = ("SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH", SPEC_V2_ENV)


def params_from_argv(words: Iterable[str], env_lines: Iterable[str] = ()) -> LaunchParams:
    """Inverse of ``params_argv`` over an attempt's recorded argv (either dialect), plus the
    ``PARAMS_ENV`` settings among ``export NAME='value'`` lines of its env file."""
    kw: dict[str, object] = {}
    argv = list(words)
    switches = {w.strip("'\"") for w in argv}
    for name, switch in PARAM_SWITCHES.items():
        if switch in switches:
            kw[name] = True
    for quoted_flag, raw in itertools.pairwise(argv):
        flag, value = quoted_flag.strip("'\""), raw.strip("'\"")
        field = PARAM_FLAGS.get(flag)
        if field is None:
            continue
        try:
            kw[field] = PARAM_TYPES[field](value)
        except ValueError:
            continue  # a flag name used as a value: not ours
    env: list[tuple[str, str]] = []
    for line in env_lines:
        parts = shlex.split(line) if line.startswith("export ") else []
        if len(parts) == 2 and "=" in parts[1]:
            name, value = parts[1].split("=", 1)
            if name in PARAMS_ENV:
                env.append((name, value))
    return LaunchParams(**kw, env=tuple(sorted(env)))  # type: ignore[arg-type]


# --- secret flags -----------------------------------------------------------------------------

# Flags whose value is a secret: SGLang's ``--api-key`` / ``--admin-api-key`` (server_args.py of
# SGLang 0.5.23; argv or a ``--config`` YAML file are its only ways in) and sglang-router's
# ``--api-key`` (sglang_router/router_args.py of 0.3.2: argv only). argv is readable by every
# user of the host (``ps``, /proc/PID/cmdline) unless procfs is mounted with hidepid, so
# launcher never puts them there: see ``hidden_args_argv``.
SECRET_FLAGS = ("--api-key", "--admin-api-key")
SECRET_ARG_ENV = "LAUNCHER_SECRET_ARG_{}"  # the environment variable of the i-th hidden flag


def full_flag(name: str, known: Collection[str]) -> str:
    """``name``, or the one flag of ``known`` it abbreviates. SGLang's argparse takes any
    unambiguous prefix (``allow_abbrev``; 0.5.23 ``server_args.py:679``). Resolving among the
    flags a reader knows, rather than all of SGLang's, is safe: a prefix of exactly one of
    them that SGLang finds ambiguous among all its flags makes SGLang refuse to start, so
    whatever the reader concluded from it is never used."""
    if name in known or not name.startswith("--") or len(name) < 4:
        return name
    found = [f for f in known if f.startswith(name)]
    return found[0] if len(found) == 1 else name


def is_secret_flag(word: str) -> bool:
    """Whether ``word`` (``--flag`` or ``--flag=value``) names a secret flag, argparse
    abbreviations (``--api-k``) included."""
    flag = word.split("=", 1)[0]
    if not flag.startswith("--"):
        return False
    return flag in SECRET_FLAGS or (
        len(flag) >= len("--api-k") and any(s.startswith(flag) for s in SECRET_FLAGS))


def mask_secret_flags(argv: list[str] | tuple[str, ...]) -> list[str]:
    """``argv`` for display: the value of every secret flag (``--api-key V`` or
    ``--api-key=V``) replaced by ``***``."""
    out: list[str] = []
    masking = False
    for word in argv:
        if masking:
            out.append(MASK)
            masking = False
        elif is_secret_flag(word):
            if "=" in word:
                out.append(word.split("=", 1)[0] + "=" + MASK)
            else:
                out.append(word)
                masking = True
        else:
            out.append(word)
    return out


# A secret flag (or an abbreviation of one) and its value in a shell-quoted command line.
_FLAG_IN_TEXT = re.compile(
    r"(?P<flag>--(?:admin-api-key|admin-api-ke?|admin-api-?|admin-a|admin-|admin"
    r"|api-key|api-ke?|api-k))(?P<sep>=|\s+)(?P<value>'[^']*'|\"[^\"]*\"|\S+)")


def mask_secret_flags_text(text: str) -> str:
    """``text`` (a command line as the ``cmd`` file of an attempt holds it) with the value
    of every secret flag replaced by ``***``."""
    return _FLAG_IN_TEXT.sub(lambda m: f"{m['flag']}{m['sep']}{MASK}", text)


# Run as ``PYTHON -c CODE MODULE N FLAG... ARG...``: appends ``FLAG value`` for each of the N
# flags, the i-th value taken (and removed) from the environment variable SECRET_ARG_ENV(i),
# then runs MODULE as ``python -m`` would. sys.argv is the process's own copy: what the host
# shows as the command line (/proc/PID/cmdline) stays without the values.
_HIDDEN_ARGS_CODE = (
    "import os,runpy,sys;m,n=sys.argv[1],int(sys.argv[2]);f=sys.argv[3:3+n];"
    "sys.argv=[m,*sys.argv[3+n:]];"
    "[sys.argv.extend((x,os.environ.pop('" + SECRET_ARG_ENV.replace("{}", "%d") + "'%i)))"
    " for i,x in enumerate(f)];"
    "runpy.run_module(m,run_name='__main__',alter_sys=True)"
)


def hidden_args_argv(command: list[str], flags: list[str], args: list[str]) -> list[str] | None:
    """The command line that runs ``command`` (``... PYTHON -m MODULE ...``) with ``args``
    and then each of ``flags`` with its value from the environment (SECRET_ARG_ENV), never
    on the command line; None when ``command`` has no ``-m MODULE`` to wrap."""
    for i, word in enumerate(command[:-1]):
        if word == "-m":
            return [*command[:i], "-c", _HIDDEN_ARGS_CODE, command[i + 1], str(len(flags)),
                    *flags, *command[i + 2:], *args]
    return None


"""The configuration: a TOML file, overridden by ``LAUNCHER_*`` environment variables and
systemd credentials. This module holds the schema; ``launcher.config.load`` the loading,
``launcher.config.problems`` the problems (error wording, cross-entry checks) and
``launcher.config.sources`` where values come from (pydantic-settings sources).

Entry points:

- ``load_config(path, environ=...)`` (``launcher.config.load``) reads the file, applies the
  overrides and validates everything. Bad input of any kind raises one ``ConfigError`` whose
  ``problems`` list every problem found, each as ``toml.path: message``
  (``servers[1].gpus: ...``), ending in ``(from LAUNCHER_...)`` when an override set the value.
- ``config_from_dict(data, environ=...)`` does the same for an already parsed table.
- ``resolve_secret_env(server, environ)`` reads the values of a server's ``secret_env`` (and
  ``secret_args``); ``resolve_router_api_key(router, environ)`` a router's ``api_key``.

``Config`` is a pydantic-settings ``BaseSettings``: the file comes through its TOML source,
overrides through its env source (prefix ``LAUNCHER_``, nested delimiter ``__``, names matched
case-insensitively) and its secrets-dir source over ``$CREDENTIALS_DIRECTORY`` (a credential
file named like a variable acts like it). Array entries are addressed by index or by their
``name`` by one custom source: ``LAUNCHER_SERVERS__0__PORT`` and
``LAUNCHER_SERVERS__LLAMA__PORT`` both set the port of the server named ``llama`` when it is
the first one. Values beginning with ``[`` or ``{`` are JSON
(``LAUNCHER_SERVERS__0__GPUS='[0, 1]'``); everything else is a string that validation converts
like any TOML value. A variable without ``__`` is only read when it names a top-level key
(``LAUNCHER_STATE_DIR``), so unrelated variables such as ``LAUNCHER_SLACK_WEBHOOK`` are left
alone. docs/config.md explains the layers.
"""

from __future__ import annotations

import copy
import difflib
import math
import os
import re
import shlex
import socket
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from launcher.durations import format_duration, parse_duration
from launcher.errors import ConfigError
from launcher.memory.estimate import DEFAULT_MARGIN
from launcher.memory.policy import Bounds
from launcher.params import LaunchParams
from launcher.sglang.flags import (
    OWNED_FLAGS,
    SECRET_ARG_ENV,
    hidden_args_argv,
    is_secret_flag,
)
from launcher.sglang.phases import Phase
from launcher.sglang.versions import GATED_LAUNCH_FROM, MAMBA_RADIX_SPELLING_FROM, at_least

__all__ = [
    "CREDENTIALS_VAR",
    "ENV_PREFIX",
    "LOADING",
    "LOOPBACK",
    "SGLANG_HEALTH_TIMEOUT_S",
    "Config",
    "HostConfig",
    "Loading",
    "MetricsConfig",
    "PolicyConfig",
    "PolicyOverride",
    "ServerConfig",
    "SlackConfig",
    "StallBudgets",
    "StallOverride",
    "default_state_dir",
    "did_you_mean",
    "resolve_router_api_key",
    "resolve_secret_env",
    "secret_arg_env",
    "unreadable_secrets",
]

ENV_PREFIX = "LAUNCHER_"
ENV_DELIMITER = "__"
# systemd sets it to the directory of the unit's LoadCredential= files (``cred:NAME``
# secrets and the credential overrides of ``launcher.config.sources`` read it).
CREDENTIALS_VAR = "CREDENTIALS_DIRECTORY"
# SGLang's /health answers 503 after SGLANG_HEALTH_CHECK_TIMEOUT (20 s); a probe that gives up
# sooner would call a slow-but-healthy server dead.
SGLANG_HEALTH_TIMEOUT_S = 20.0

Loc = tuple[str | int, ...]

_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+(\.post\d+)?$")
# cred:NAME is a file of $CREDENTIALS_DIRECTORY (systemd LoadCredential=NAME:...): a plain name.
_SECRET_REF_RE = re.compile(
    r"^(?:env:[A-Za-z_][A-Za-z0-9_]*|file:.+|cred:(?!\.{1,2}$)[A-Za-z0-9_.@-]+)$"
)

# SGLang flags whose value launcher decides, and the config field that sets each one.
_OWNED_FLAGS = OWNED_FLAGS


# --- field types -------------------------------------------------------------------------


def _duration(value: object) -> float:
    if not isinstance(value, str | int | float):
        return parse_duration(repr(value))  # raises, naming the accepted forms
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"duration {value!r} must be more than 0 s")
    return seconds


def _above_health_timeout(seconds: float) -> float:
    if seconds <= SGLANG_HEALTH_TIMEOUT_S:
        raise ValueError(
            f"{format_duration(seconds)} is not > 20s: SGLang's /health itself waits "
            "up to 20 s (SGLANG_HEALTH_CHECK_TIMEOUT) before answering, so a shorter probe "
            "calls a busy server dead; use e.g. '30s'"
        )
    return seconds


def _name(value: str) -> str:
    if not _NAME_RE.match(value):
        raise ValueError(f"{value!r} is not a valid name: use letters, digits, '_', '.' and '-'")
    if value in (".", ".."):  # names become directory names on hosts
        raise ValueError(f"{value!r} is not a valid name: it is a directory of its own")
    return value


def _remote_dir(value: str) -> str:
    if value.startswith("-"):
        raise ValueError(f"{value!r} starts with '-' (it would read as an option): "
                         "use an absolute path, or prefix it with './'")
    return value


def _jump_host(value: str) -> str:
    """``[user@]host[:port]``, parsed as the SSH transport does."""
    _, _, hostport = value.rpartition("@")
    address, sep, port = hostport.rpartition(":")
    if not sep:
        address, port = hostport, ""
    if not address or (sep and not (port.isascii() and port.isdigit()
                                    and 1 <= int(port) <= 65535)):
        raise ValueError(f"{value!r} is not [user@]host[:port] with a port from 1 to 65535")
    return value


def _node_list(nodes: list[str]) -> list[str]:
    if not nodes:
        raise ValueError("must list at least one host (node 0 first), or use host = ... instead")
    repeated = sorted({n for n in nodes if nodes.count(n) > 1})
    if repeated:
        raise ValueError(f"{', '.join(map(repr, repeated))} listed more than once: each node "
                         "is a different host")
    return nodes


def _host_port(value: str) -> str:
    """``host:port`` (IPv6 as ``[addr]:port``), as SGLang's --dist-init-addr takes it."""
    host, sep, port = value.rpartition(":")
    if not sep or not host.strip("[]") or not (port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError(f"{value!r} is not HOST:PORT with a port in 1..65535 "
                         "(e.g. '10.0.4.21:5000')")
    return value


def _argv(value: object) -> object:
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError as exc:  # unbalanced quotes
            raise ValueError(f"cannot split {value!r} into arguments: {exc}") from None
    return value


def _non_empty_argv(value: list[str]) -> list[str]:
    if not value or not value[0]:
        raise ValueError("must name a program (a non-empty list of strings)")
    return value


def _env_values(value: object) -> object:
    # TOML writes OMP_NUM_THREADS = 8 naturally; the process environment only holds strings.
    if isinstance(value, Mapping):
        return {
            k: str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v
            for k, v in value.items()
        }
    return value


def _env_names(value: dict[str, str]) -> dict[str, str]:
    bad = [key for key in value if not _ENV_NAME_RE.match(key)]
    if bad:
        raise ValueError(f"{', '.join(map(repr, bad))}: not a valid environment variable name")
    return value


def _expand(path: Path) -> Path:
    return path.expanduser()


Duration = Annotated[float, BeforeValidator(_duration)]


def _reminder_off_or_duration(value: object) -> object:
    if isinstance(value, str) and value.strip().lower() == "off":
        return 0.0
    return _duration(value)


def _reminder_interval(seconds: float) -> float:
    if seconds != 0 and seconds < 60:
        raise ValueError(
            f"{seconds:g}s is too short: use at least 1m, or \"off\" to turn reminders off")
    return seconds
ProbeTimeout = Annotated[float, BeforeValidator(_duration), AfterValidator(_above_health_timeout)]
Fraction = Annotated[float, Field(gt=0, lt=1)]
AtLeastOne = Annotated[int, Field(ge=1)]
Port = Annotated[int, Field(ge=1, le=65535)]
GpuIndex = Annotated[int, Field(ge=0)]
Name = Annotated[str, AfterValidator(_name)]
Argv = Annotated[list[str], BeforeValidator(_argv)]
# Programs whose command runs somewhere launcher's signals do not reach (see
# ServerConfig._signalable_command).
_DETACHED_EXEC_CLIENTS = frozenset({
    "docker", "podman", "nerdctl", "kubectl", "oc", "crictl", "ctr", "lxc", "incus", "ssh",
})
Program = Annotated[list[str], BeforeValidator(_argv), AfterValidator(_non_empty_argv)]
EnvMap = Annotated[dict[str, str], BeforeValidator(_env_values), AfterValidator(_env_names)]
LocalPath = Annotated[Path, AfterValidator(_expand)]
RemoteDir = Annotated[str, Field(min_length=1), AfterValidator(_remote_dir)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- policy ------------------------------------------------------------------------------


class StallBudgets(_Model):
    """How long (seconds) a server may stay silent in each start-up phase before it is a hang."""

    init: Duration = 300.0
    weights: Duration = 1200.0
    kv_cache: Duration = 300.0
    cuda_graph: Duration = 1200.0
    warmup: Duration = 600.0

    def for_phase(self, phase: Phase) -> float:
        """The silence budget of ``phase``; ``math.inf`` for READY (no start-up stall there)."""
        if phase is Phase.READY:
            return math.inf
        budget: float = getattr(self, phase.value)
        return budget


class PolicyConfig(_Model):
    """Retry, stall, probe and restart policy. Durations are seconds.

    Invariants checked at load: ``mem_fraction_floor < mem_fraction_ceiling``,
    ``restart_backoff_initial <= restart_backoff_max``, ``probe_timeout > 20 s``.
    """

    mem_fraction_floor: Fraction = 0.50
    mem_fraction_ceiling: Fraction = 0.95
    graph_bs_floor: AtLeastOne = 1
    max_attempts: AtLeastOne = 6
    start_deadline: Duration = 1800.0
    max_stalls: Annotated[int, Field(ge=0)] = 2
    gpu_free_timeout: Duration = 120.0
    probe_interval: Duration = 10.0
    probe_timeout: ProbeTimeout = 30.0
    probe_failures: AtLeastOne = 3
    restart_backoff_initial: Duration = 10.0
    restart_backoff_max: Duration = 600.0
    restart_budget: Annotated[int, Field(ge=0)] = 5
    restart_window: Duration = 3600.0
    healthy_reset: Duration = 1800.0
    # Apply, once, a fix SGLang's own error names (e.g. 0.5.10's "please use
    # --mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1"); off: advise it.
    apply_prescribed_fixes: bool = False
    # Under speculative decoding on SGLang >= 0.5.23, set SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1
    # when lowering the fraction and the graph bs cannot make a capture OOM fit.
    allow_disable_draft_extend_graph: bool = False
    # The first attempt's params (docs/memory.md): "auto" fills an unset mem_fraction_static /
    # cuda_graph_max_bs from the memory estimate; "estimate" lets the estimate choose both even
    # when set; "configured" never estimates (unset means SGLang's auto value). The ledger's
    # last good params for the same launch win over all three.
    initial: Literal["auto", "estimate", "configured"] = "auto"
    # The share of the estimated graph + activation memory the estimate keeps spare.
    estimate_margin: Annotated[float, Field(ge=0.0, le=2.0)] = DEFAULT_MARGIN
    stall: StallBudgets = Field(default_factory=StallBudgets)

    def bounds(self) -> Bounds:
        """The OOM policy's search limits (``memory.policy.Bounds``), every field from this
        policy: what the supervisor searches within and what `plan`'s ladder shows."""
        return Bounds(
            self.mem_fraction_floor, self.mem_fraction_ceiling, self.graph_bs_floor,
            self.max_attempts, apply_prescribed_fixes=self.apply_prescribed_fixes,
            allow_disable_draft_extend_graph=self.allow_disable_draft_extend_graph,
        )


class StallOverride(_Model):
    """A server's ``[servers.policy.stall]``: only the phases it sets replace the global ones."""

    init: Duration | None = None
    weights: Duration | None = None
    kv_cache: Duration | None = None
    cuda_graph: Duration | None = None
    warmup: Duration | None = None


class PolicyOverride(_Model):
    """A server's ``policy`` table: any ``[policy]`` key; unset keys keep the global value."""

    mem_fraction_floor: Fraction | None = None
    mem_fraction_ceiling: Fraction | None = None
    graph_bs_floor: AtLeastOne | None = None
    max_attempts: AtLeastOne | None = None
    start_deadline: Duration | None = None
    max_stalls: Annotated[int, Field(ge=0)] | None = None
    gpu_free_timeout: Duration | None = None
    probe_interval: Duration | None = None
    probe_timeout: ProbeTimeout | None = None
    probe_failures: AtLeastOne | None = None
    restart_backoff_initial: Duration | None = None
    restart_backoff_max: Duration | None = None
    restart_budget: Annotated[int, Field(ge=0)] | None = None
    restart_window: Duration | None = None
    healthy_reset: Duration | None = None
    apply_prescribed_fixes: bool | None = None
    allow_disable_draft_extend_graph: bool | None = None
    initial: Literal["auto", "estimate", "configured"] | None = None
    estimate_margin: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    stall: StallOverride = Field(default_factory=StallOverride)

    def applied_to(self, base: PolicyConfig) -> PolicyConfig:
        """``base`` with every key this override sets replaced, field by field."""
        changes = self.model_dump(exclude_none=True)
        stall_changes = changes.pop("stall", {})
        merged = base.model_dump()
        merged.update(changes)
        merged["stall"].update(stall_changes)
        return PolicyConfig.model_validate(merged)


# --- hosts and servers -------------------------------------------------------------------


class HostConfig(_Model):
    """One GPU host. ``transport = "local"`` runs commands on this machine without SSH.

    ``identity_file`` and ``known_hosts`` are paths on this machine (``~`` expanded);
    ``run_dir`` is a path on the host, kept as written (its ``~`` is the remote user's).
    """

    name: Name
    transport: Literal["ssh", "local"] = "ssh"
    address: str | None = None
    port: Port | None = None
    user: str | None = None
    identity_file: LocalPath | None = None
    known_hosts: LocalPath | None = None
    use_ssh_config: bool = True
    jump_host: Annotated[str, AfterValidator(_jump_host)] | None = None
    trust_on_first_use: bool = False
    connect_timeout: Duration = 10.0
    keepalive_interval: Duration = 15.0
    nvidia_smi: Program = Field(default_factory=lambda: ["nvidia-smi"])
    env: EnvMap = Field(default_factory=dict)
    run_dir: RemoteDir = "~/.launcher/runs"


class ServerConfig(_Model):
    """One SGLang server. ``gpus`` become CUDA_VISIBLE_DEVICES; ``len(gpus) == tp * dp``.

    ``mem_fraction_static`` / ``cuda_graph_max_bs`` of ``None`` leave SGLang's auto choice, and
    so do ``max_running_requests`` and the hybrid (Mamba) knobs; ``mamba_strategy`` is rendered
    as ``--mamba-scheduler-strategy`` up to 0.5.10 and ``--mamba-radix-cache-strategy`` from
    0.5.15 (see ``launch_params``; the policy may change all of these on a relaunch).
    ``secret_env`` values are references, ``env:VAR``, ``file:/path`` or ``cred:NAME`` on this
    machine; read them with ``resolve_secret_env``. ``secret_args`` maps a secret flag
    (``--api-key``, ``--admin-api-key``) to such a reference: the value reaches SGLang through
    the environment and is appended to its argv inside the process (``hidden_args_argv``), so
    it is never on the host's command line; such flags are refused in ``extra_args`` and
    ``command``. ``run_dir`` ``None`` means the host's.
    """

    name: Name
    host: str  # node 0's host when ``nodes`` is set (filled in from it)
    # Multi-node (one server over several hosts): every host in rank order, node 0 first;
    # ``gpus`` apply on each. launcher/plan/multinode.py renders
    # --nnodes/--node-rank/--dist-init-addr.
    nodes: Annotated[list[Name], AfterValidator(_node_list)] | None = None
    dist_init_port: Port | None = None
    dist_init_addr: Annotated[str, AfterValidator(_host_port)] | None = None
    # SGLang >= 0.5.23: every rank blocks after distributed init until launcher POSTs
    # /gate/activate on node 0's port, once every node waits there (all ranks joined).
    gated_launch_port: Port | None = None
    model_path: Annotated[str, Field(min_length=1)]
    served_model_name: str | None = None
    tp: AtLeastOne = 1
    dp: AtLeastOne = 1
    port: Port = 30000
    listen: Annotated[str, Field(min_length=1)] = "127.0.0.1"
    gpus: list[GpuIndex]
    mem_fraction_static: Fraction | None = None
    cuda_graph_max_bs: AtLeastOne | None = None
    max_running_requests: AtLeastOne | None = None
    max_mamba_cache_size: AtLeastOne | None = None
    mamba_full_memory_ratio: Annotated[float, Field(gt=0)] | None = None
    mamba_strategy: Literal["auto", "no_buffer", "extra_buffer", "extra_buffer_lazy"] | None = None
    disable_overlap_schedule: bool | None = None
    extra_args: Argv = Field(default_factory=list)
    env: EnvMap = Field(default_factory=dict)
    secret_env: EnvMap = Field(default_factory=dict)
    secret_args: dict[str, str] = Field(default_factory=dict)
    command: Program = Field(default_factory=lambda: ["python3", "-m", "sglang.launch_server"])
    sglang_version: str | None = None
    run_dir: RemoteDir | None = None
    probe: Literal["tunnel", "direct"] = "tunnel"
    policy: PolicyOverride = Field(default_factory=PolicyOverride)

    @model_validator(mode="before")
    @classmethod
    def _host_from_nodes(cls, data: Any) -> Any:
        # ``nodes`` names node 0 first; ``host`` stands for it everywhere one host is meant
        # (version detection, probes, fingerprint). Both set is reported by the cross-checks.
        if isinstance(data, dict) and "host" not in data:
            nodes = data.get("nodes")
            if isinstance(nodes, list) and nodes and isinstance(nodes[0], str):
                return {**data, "host": nodes[0]}
        return data

    @model_validator(mode="after")
    def _gate_exists_in_version(self) -> ServerConfig:
        version = self.sglang_version
        if (self.gated_launch_port is not None and version is not None
                and not at_least(version, GATED_LAUNCH_FROM)):
            raise ValueError(f"gated_launch_port needs SGLang >= 0.5.23 (this server runs "
                             f"{version}, which has no --gated-launch-port)")
        return self

    @property
    def node_hosts(self) -> list[str]:
        """The hosts of the server's ranks in rank order (one for a single-host server)."""
        return list(self.nodes) if self.nodes else [self.host]

    @property
    def nnodes(self) -> int:
        return len(self.node_hosts)

    @property
    def probe_address(self) -> str:
        """The address on its host (node 0's for a multi-node server) that the probes dial,
        through the transport or the host's agent (see probe_address)."""
        return probe_address(self.listen)

    @field_validator("gpus")
    @classmethod
    def _unique_gpus(cls, gpus: list[int]) -> list[int]:
        repeated = sorted({gpu for gpu in gpus if gpus.count(gpu) > 1})
        if repeated:
            raise ValueError(f"GPU {', '.join(map(str, repeated))} listed more than once")
        return gpus

    @field_validator("command")
    @classmethod
    def _signalable_command(cls, command: list[str]) -> list[str]:
        client = command[0].rpartition("/")[2]
        if client in _DETACHED_EXEC_CLIENTS:
            raise ValueError(
                f"{shlex.join(command[:3])!r}: a process that {client} starts belongs to "
                "the container runtime (or another machine), not to the process group "
                "launcher signals, so stop and kill would end only the client and leave the "
                "server holding its GPUs; run sglang on the host, add the container (with "
                "an sshd) as a host of its own, or use a prefix that keeps the server its "
                "child (unshare, nsenter, env, nice, numactl, taskset)"
            )
        return command

    @field_validator("extra_args", "command")
    @classmethod
    def _no_secret_flags(cls, args: list[str]) -> list[str]:
        return _refuse_secret_flags(args, "secret_args = { \"--api-key\" = \"env:VAR\" }")

    @field_validator("secret_args")
    @classmethod
    def _secret_arg_references(cls, refs: dict[str, str]) -> dict[str, str]:
        return _check_secret_args(refs)

    @model_validator(mode="after")
    def _secret_args_need_a_module(self) -> ServerConfig:
        if self.secret_args and hidden_args_argv(self.command, [], []) is None:
            raise ValueError(_NO_MODULE.format(field="secret_args"))
        return self

    @field_validator("extra_args")
    @classmethod
    def _no_owned_flags(cls, args: list[str]) -> list[str]:
        clashes = []
        for arg in args:
            field = _owned_flag_field(arg)
            if field is not None:
                clashes.append(f"{arg.split('=', 1)[0]!r} is set by launcher; use {field} = ...")
        if clashes:
            raise ValueError("; ".join(clashes))
        return args

    @field_validator("secret_env")
    @classmethod
    def _secret_references(cls, refs: dict[str, str]) -> dict[str, str]:
        bad = [key for key, ref in refs.items() if not _SECRET_REF_RE.match(ref)]
        if bad:
            # Never echo the value: it may be the secret itself.
            raise ValueError(
                f"{', '.join(bad)}: a secret_env value must be 'env:VARIABLE' (read from this "
                "machine's environment) or 'file:/path' (read from a file on this machine), "
                "never the secret itself"
            )
        return refs

    @field_validator("sglang_version")
    @classmethod
    def _version_shape(cls, version: str | None) -> str | None:
        if version is not None and not _VERSION_RE.match(version):
            raise ValueError(f"{version!r} is not a version like '0.5.23' or '0.5.6.post2'")
        return version

    @model_validator(mode="after")
    def _strategy_exists_in_version(self) -> ServerConfig:
        version = self.sglang_version
        if (
            self.mamba_strategy == "extra_buffer_lazy"
            and version is not None
            and not at_least(version, MAMBA_RADIX_SPELLING_FROM)
        ):
            raise ValueError(
                f"mamba_strategy 'extra_buffer_lazy' needs SGLang >= 0.5.15 (this server runs "
                f"{version}, whose --mamba-scheduler-strategy has auto, no_buffer, extra_buffer)"
            )
        return self

    def launch_params(self) -> LaunchParams:
        """The configured knobs as the first attempt's params (None fields: SGLang's auto)."""
        return LaunchParams(
            mem_fraction_static=self.mem_fraction_static,
            cuda_graph_max_bs=self.cuda_graph_max_bs,
            max_running_requests=self.max_running_requests,
            max_mamba_cache_size=self.max_mamba_cache_size,
            mamba_full_memory_ratio=self.mamba_full_memory_ratio,
            mamba_strategy=self.mamba_strategy,
            disable_overlap_schedule=self.disable_overlap_schedule or None,
        )


def _owned_flag_field(arg: str) -> str | None:
    """The config field that owns SGLang flag ``arg`` (``--tp-size=4`` too), or None."""
    if not arg.startswith("--"):
        return None
    flag = arg.split("=", 1)[0]
    if flag in _OWNED_FLAGS:
        return _OWNED_FLAGS[flag]
    if flag.startswith("--cuda-graph-max-bs"):
        return "cuda_graph_max_bs"
    # argparse accepts unambiguous abbreviations, so "--mem-frac" is --mem-fraction-static.
    if len(flag) >= 4:
        for owned, field in _OWNED_FLAGS.items():
            if owned.startswith(flag):
                return field
    return None


# --- optional sections -------------------------------------------------------------------


class SlackConfig(_Model):
    """Where the Slack webhook URL comes from: ``webhook`` (set by the credential or variable
    ``LAUNCHER_SLACK__WEBHOOK``, never in the file), else ``webhook_url_file``, else the
    variable ``webhook_url_env`` names."""

    webhook: SecretStr | None = None
    webhook_url_env: Annotated[str, Field(pattern=_ENV_NAME_RE.pattern)] = "LAUNCHER_SLACK_WEBHOOK"
    webhook_url_file: LocalPath | None = None
    # A restarted launcher that finds a server running adopts it silently; true posts an
    # "adopted" message instead.
    announce_adoption: bool = False
    # A problem still firing (gave up, unhealthy, relaunched) is posted again this often
    # until the server is ready ("4h", "30m"; "off": never). At least a minute: anything
    # shorter floods the channel it is meant to keep readable.
    remind_every: Annotated[float, BeforeValidator(_reminder_off_or_duration),
                            AfterValidator(_reminder_interval)] = 4 * 3600.0

    def webhook_url(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The webhook URL, or None when none of the sources gives a non-empty one.

        Raises ConfigError when ``webhook_url_file`` is set but cannot be read or is empty.
        """
        # An empty credential is "not set" (the systemd unit's LoadCredential= needs the file
        # to exist, so the install script creates it empty): fall through to the others.
        if self.webhook is not None and self.webhook.get_secret_value().strip():
            return self.webhook.get_secret_value().strip()
        if self.webhook_url_file is not None:
            url = _read_secret_file(self.webhook_url_file, "slack.webhook_url_file", "slack")
            where = "slack.webhook_url_file"
        else:
            env = os.environ if environ is None else environ
            url, where = env.get(self.webhook_url_env) or "", self.webhook_url_env
        if not url:
            return None
        scheme, _, rest = url.partition("://")
        host = rest.split("/", 1)[0].rpartition("@")[2].rsplit(":", 1)[0].strip("[]")
        if not (scheme.lower() == "https"
                or (scheme.lower() == "http" and host in ("127.0.0.1", "localhost", "::1"))):
            raise ConfigError([f"{where}: the Slack webhook URL must be https:// (plain http "
                               "only to 127.0.0.1/localhost): it carries the webhook's secret"],
                              source="slack")
        return url


class MetricsConfig(_Model):
    """The Prometheus endpoint: ``listen = "HOST:PORT"`` (IPv6 as ``[::1]:9400``)."""

    listen: str = "127.0.0.1:9400"

    @field_validator("listen")
    @classmethod
    def _host_port(cls, listen: str) -> str:
        host, sep, port = listen.rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"{listen!r} is not HOST:PORT with a port in 1..65535")
        return listen

    @property
    def host(self) -> str:
        """The address to bind, without IPv6 brackets."""
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        """The TCP port to bind."""
        return int(self.listen.rpartition(":")[2])


class CoordinationConfig(_Model):
    """A fenced standby (docs/ha.md): every `launcher up` with the same ``[coordination]``
    shares one lease in PostgreSQL; one is active, the others stand by and take over once
    the active stops renewing. ``dsn`` is a secret reference (``env:VAR``, ``file:/path``,
    ``cred:NAME``) to a libpq URL (``postgresql://user:pass@db:5432/launcher``): it may
    hold a password. ``ttl``: how long a lease lasts unrenewed (renewed every ttl/3; a
    standby is active within ttl plus one poll). ``box``: this launcher's name in ``status``
    (default the host name). ``lease``: the lease's name, one per fleet sharing a database.
    """

    dsn: str
    ttl: Annotated[Duration, Field(ge=3.0, le=120.0)] = 9.0
    box: Annotated[str, Field(min_length=1, max_length=200)] = Field(
        default_factory=socket.gethostname)
    lease: Name = "launcher"

    @field_validator("dsn")
    @classmethod
    def _dsn_reference(cls, ref: str) -> str:
        if not _SECRET_REF_RE.match(ref):
            raise ValueError(_REF_SHAPE + " (the DSN may carry the database password)")
        return ref

    def resolve_dsn(self, environ: Mapping[str, str] | None = None) -> str:
        """The DSN the reference names; ConfigError naming ``coordination.dsn`` when it
        cannot be read."""
        env = os.environ if environ is None else environ
        return _resolve_refs({"dsn": self.dsn}, "coordination", env, "coordination")["dsn"]


# --- root --------------------------------------------------------------------------------


# Router flags launcher decides: where it listens comes from host/port, and its workers are
# registered at run time (a --worker-urls list would bring back servers that are not ready).
ROUTER_OWNED_FLAGS = {"--host": "listen", "--port": "port", "--worker-urls": "servers"}
ROUTER_PROMETHEUS_PORT = 29000  # sglang-router's default --prometheus-port


class RouterConfig(_Model):
    """One SGLang router (``sglang-router``; ``command`` may start the ``smg`` gateway instead)
    in front of ``servers``, supervised like a server: launched on ``host``, followed, probed
    on ``/health`` at ``port``, relaunched within the restart budget. launcher registers each
    server as a worker once it is ready and deregisters it before it stops or relaunches it.

    ``worker_urls`` maps a server name to the URL the router reaches it at; by default
    ``http://ADDRESS:PORT`` with the address the probes dial (``probe_address``: the server's
    ``listen``, or the loopback for a wildcard) when the server runs on the router's host, else
    ``http://ADDRESS:PORT`` with the server host's ``address`` (its ``listen`` must then accept
    connections from other hosts).

    ``listen`` is loopback by default: the router's worker API (``POST /workers``) lets
    whoever reaches it add or remove workers, so a wildcard (``0.0.0.0``, ``::``) is a config
    problem unless ``api_key`` is set. ``api_key`` is a secret reference (``env:VAR``,
    ``file:/path``, ``cred:NAME``): launcher sends it as ``Authorization: Bearer`` and hands it
    to the router outside its argv (``hidden_args_argv``, which needs ``command`` to be
    ``PYTHON -m MODULE``); ``--api-key`` in ``args`` or ``command`` is refused.
    """

    name: Name
    host: str
    port: Port = 30000
    listen: Annotated[str, Field(min_length=1)] = "127.0.0.1"
    api_key: str | None = None
    servers: Annotated[list[str], Field(min_length=1)]
    args: Argv = Field(default_factory=list)
    command: Program = Field(
        default_factory=lambda: ["python3", "-m", "sglang_router.launch_router"])
    env: EnvMap = Field(default_factory=dict)
    run_dir: RemoteDir | None = None
    worker_urls: dict[str, str] = Field(default_factory=dict)

    @field_validator("args", "command")
    @classmethod
    def _no_secret_router_flags(cls, args: list[str]) -> list[str]:
        return _refuse_secret_flags(args, "api_key = \"env:VAR\" (or file:/path, cred:NAME)")

    @field_validator("api_key")
    @classmethod
    def _api_key_reference(cls, ref: str | None) -> str | None:
        if ref is not None and not _SECRET_REF_RE.match(ref):
            raise ValueError(_REF_SHAPE)
        return ref

    @model_validator(mode="after")
    def _key_for_open_listen(self) -> RouterConfig:
        if self.api_key is not None and hidden_args_argv(self.command, [], []) is None:
            raise ValueError(_NO_MODULE.format(field="api_key"))
        if self.listen_is_wildcard and self.api_key is None:
            raise ValueError(
                f"listen {self.listen!r} opens the router's worker API (POST /workers adds "
                "a worker, DELETE removes one) to every machine that can reach the port: set "
                "api_key = \"env:VAR\" (or file:/path, cred:NAME) so it asks for a key, or "
                "listen on 127.0.0.1 or one interface's address")
        return self

    @property
    def listen_is_wildcard(self) -> bool:
        """Whether ``listen`` binds every interface (``0.0.0.0``, ``::``, ``[::]``)."""
        return self.listen.strip("[]") in ("0.0.0.0", "::")

    @property
    def probe_address(self) -> str:
        """The address on its host that the router's probes dial (see probe_address)."""
        return probe_address(self.listen)

    @field_validator("args")
    @classmethod
    def _no_owned_router_flags(cls, args: list[str]) -> list[str]:
        clashes = [
            f"{flag} (from this router's {ROUTER_OWNED_FLAGS[flag.split('=', 1)[0]]})"
            for flag in args if flag.split("=", 1)[0] in ROUTER_OWNED_FLAGS
        ]
        if clashes:
            raise ValueError(f"launcher sets {', '.join(clashes)}: remove it from args")
        return args

    def argv(self) -> list[str]:
        """The router's command line: ``command``, where it listens, then ``args``; with an
        ``api_key``, wrapped so that ``--api-key`` is added from the environment variable
        ``SECRET_ARG_ENV.format(0)`` inside the process (see ``hidden_args_argv``)."""
        args = ["--host", self.listen, "--port", str(self.port), *self.args]
        if self.api_key is not None:
            wrapped = hidden_args_argv(self.command, ["--api-key"], args)
            assert wrapped is not None  # checked by _key_for_open_listen
            return wrapped
        return [*self.command, *args]


class Loading(Protocol):
    """A load in progress, as ``Config`` sees it (``launcher.config.sources.Load`` is the one
    kind): the sources ``Config()`` reads, highest precedence first, and ``tree``, where
    ``Config`` leaves the merged input for the cross-entry checks."""

    tree: dict[str, Any] | None

    def sources(
        self, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource
    ) -> tuple[PydanticBaseSettingsSource, ...]: ...


# The load in progress in this context (``launcher.config.sources.loading`` sets it); outside
# one, ``Config(...)`` takes only its keyword arguments.
LOADING: ContextVar[Loading | None] = ContextVar("launcher_config_load", default=None)


def default_state_dir(environ: Mapping[str, str]) -> Path:
    """$STATE_DIRECTORY (systemd, first entry), else $XDG_STATE_HOME/launcher, else
    ~/.local/state/launcher (with ~ from $HOME in ``environ``)."""
    systemd = environ.get("STATE_DIRECTORY", "").split(":")[0]
    if systemd:
        return Path(systemd)
    xdg = environ.get("XDG_STATE_HOME", "")
    # The XDG spec says relative values are invalid and must be ignored.
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "launcher"
    home = environ.get("HOME")
    return (Path(home) if home else Path.home()) / ".local" / "state" / "launcher"


class Config(BaseSettings):
    """The whole configuration. Build it with ``load_config`` or ``config_from_dict``, which
    read the sources (file, environment, credentials: ``launcher.config.sources``) and check the
    cross-entry rules (unique names, known hosts, GPU and port clashes, ...) that validation of
    the model alone does not. ``Config(...)`` outside them takes only its keyword arguments."""

    model_config = SettingsConfigDict(
        extra="forbid",
        frozen=True,
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_DELIMITER,
        case_sensitive=False,
    )

    state_dir: LocalPath = Field(default_factory=lambda: default_state_dir(os.environ))
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    hosts: list[HostConfig] = Field(default_factory=list)
    servers: list[ServerConfig] = Field(default_factory=list)
    slack: SlackConfig | None = None
    metrics: MetricsConfig | None = None
    routers: list[RouterConfig] = Field(default_factory=list)
    coordination: CoordinationConfig | None = None

    def server(self, name: str) -> ServerConfig:
        """The server called ``name``; ConfigError (with did-you-mean) if there is none."""
        for server in self.servers:
            if server.name == name:
                return server
        raise ConfigError(
            [f"servers: no server named {name!r}; "
             f"{did_you_mean([s.name for s in self.servers], name)}"]
        )

    def router(self, name: str) -> RouterConfig:
        """The router called ``name``; ConfigError (with did-you-mean) if there is none."""
        for router in self.routers:
            if router.name == name:
                return router
        raise ConfigError(
            [f"routers: no router named {name!r}; "
             f"{did_you_mean([r.name for r in self.routers], name)}"]
        )

    def host(self, name: str) -> HostConfig:
        """The host called ``name``; ConfigError (with did-you-mean) if there is none."""
        for host in self.hosts:
            if host.name == name:
                return host
        raise ConfigError(
            [f"hosts: no host named {name!r}; {did_you_mean([h.name for h in self.hosts], name)}"]
        )

    def run_dir_of(self, unit: ServerConfig | RouterConfig, host: str | None = None) -> str:
        """The directory on ``host`` (default: the unit's own; a multi-node server's other
        nodes name theirs) under which ``unit``'s attempts run, as ``<it>/<name>/<attempt>``
        (``<name>.node<R>`` for a rank): the unit's ``run_dir``, else the host's. Kept as
        written (its ``~`` is the remote user's)."""
        return unit.run_dir or self.host(host or unit.host).run_dir

    def policy_for(self, server_name: str) -> PolicyConfig:
        """The global ``[policy]`` with the server's ``policy`` table applied field by field."""
        return self.server(server_name).policy.applied_to(self.policy)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The load's sources (``Loading.sources``); only ``init_settings`` outside one."""
        load = LOADING.get()
        return (init_settings,) if load is None else load.sources(settings_cls, init_settings)

    @model_validator(mode="before")
    @classmethod
    def _remember_input(cls, data: Any) -> Any:
        # The cross-entry checks read the merged input, which only exists in here.
        load = LOADING.get()
        if load is not None and isinstance(data, dict):
            load.tree = copy.deepcopy(data)
        return data


_REF_SHAPE = ("a secret must be given as 'env:VARIABLE' (read from this machine's "
              "environment), 'file:/path' (a file on this machine) or 'cred:NAME' (systemd "
              "LoadCredential=), never as the secret itself")
_NO_MODULE = ("{field} needs command to run a Python module ('PYTHON -m MODULE ...'): launcher "
              "hands the secret to it through the environment, never on the command line, "
              "which every user of the host can read")


def _refuse_secret_flags(args: list[str], instead: str) -> list[str]:
    found = sorted({a.split("=", 1)[0] for a in args if is_secret_flag(a)})
    if found:
        # Never echo the value: it is the secret.
        raise ValueError(
            f"{', '.join(found)} would put a secret on the command line, which every user of "
            f"the host can read (ps, /proc/PID/cmdline); remove it and use {instead}")
    return args


def _check_secret_args(refs: dict[str, str]) -> dict[str, str]:
    problems = [f"{flag!r} is not a flag (--name)" for flag in refs
                if not flag.startswith("--") or "=" in flag]
    problems += [f"{flag}: {_REF_SHAPE}" for flag, ref in refs.items()
                 if not _SECRET_REF_RE.match(ref)]
    if problems:
        raise ValueError("; ".join(problems))
    return refs


def secret_arg_env(server: ServerConfig) -> dict[str, str]:
    """The environment variable that carries each of ``server.secret_args`` (by flag)."""
    return {flag: SECRET_ARG_ENV.format(i) for i, flag in enumerate(server.secret_args)}


def resolve_router_api_key(
    router: RouterConfig, environ: Mapping[str, str] | None = None,
) -> str | None:
    """The value of ``router.api_key`` (None without one), read like ``resolve_secret_env``;
    ConfigError naming ``routers[NAME].api_key`` when it cannot be read."""
    if router.api_key is None:
        return None
    env = os.environ if environ is None else environ
    return _resolve_refs({"api_key": router.api_key}, f"routers[{router.name}]", env,
                         router.name)["api_key"]


def resolve_secret_env(
    server: ServerConfig, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The values of ``server.secret_env``: ``env:VAR`` from ``environ`` (default
    ``os.environ``), ``file:PATH`` from that file on this machine (``~`` expanded), and
    ``cred:NAME`` from the file NAME in ``$CREDENTIALS_DIRECTORY`` of ``environ`` (systemd's
    ``LoadCredential=NAME:PATH``); surrounding whitespace is stripped.

    Error handling: raises one ConfigError listing every secret that is unset, empty or
    unreadable, naming the field and the variable or file. Values never appear in errors.
    """
    env = os.environ if environ is None else environ
    values = _resolve_refs(server.secret_env, f"servers[{server.name}].secret_env", env,
                           server.name)
    args = _resolve_refs(server.secret_args, f"servers[{server.name}].secret_args", env,
                         server.name)
    for flag, name in secret_arg_env(server).items():
        values[name] = args[flag]
    return values


def unreadable_secrets(server: ServerConfig,
                       environ: Mapping[str, str] | None = None) -> set[str]:
    """The names of the env variables of ``server`` (its ``secret_env`` keys and those its
    ``secret_args`` reach it by) whose reference cannot be read here, each read as
    ``resolve_secret_env`` reads it."""
    env = os.environ if environ is None else environ
    names = {**{key: (key, ref) for key, ref in server.secret_env.items()},
             **{name: (flag, server.secret_args[flag])
                for flag, name in secret_arg_env(server).items()}}
    missing = set()
    for name, (key, ref) in names.items():
        try:
            _resolve_refs({key: ref}, "secret", env, server.name)
        except ConfigError:
            missing.add(name)
    return missing


def _resolve_refs(refs: Mapping[str, str], at: str, env: Mapping[str, str],
                  source: str) -> dict[str, str]:
    """Every reference of ``refs`` read (see ``resolve_secret_env``); one ConfigError for all
    that cannot be, fields named ``AT.KEY``."""
    values: dict[str, str] = {}
    problems: list[str] = []
    for key, ref in refs.items():
        field = f"{at}.{key}"
        kind, _, target = ref.partition(":")
        if kind == "env":
            value = env.get(target, "")
            if not value:
                state = "is empty" if target in env else "is not set"
                problems.append(f"{field}: environment variable {target} {state} on this machine")
                continue
            values[key] = value
        elif kind == "cred":
            directory = env.get(CREDENTIALS_VAR, "")
            if not directory:
                problems.append(
                    f"{field}: credential {target}: ${CREDENTIALS_VAR} is not set on this "
                    f"machine (systemd sets it for LoadCredential={target}:/path in the unit)"
                )
                continue
            try:
                values[key] = _read_secret_file(Path(directory) / target, field, source)
            except ConfigError as exc:
                problems.extend(exc.problems)
        else:
            try:
                values[key] = _read_secret_file(Path(target), field, source)
            except ConfigError as exc:
                problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems, source="secret_env")
    return values


def _read_secret_file(path: Path, field: str, source: str) -> str:
    path = path.expanduser()
    try:
        value = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError([f"{field}: cannot read {path}: {reason}"], source=source) from None
    if not value:
        raise ConfigError([f"{field}: file {path} is empty"], source=source)
    return value


# --- shared with the checks (launcher.config.problems) ----------------------------------


def did_you_mean(names: Sequence[str], wanted: str) -> str:
    """The hint after an unknown name ``wanted``: the closest of ``names`` if one is close
    (``did you mean 'llama'? ``), then every known name (``known: a, b``, or ``none``)."""
    unique = list(dict.fromkeys(names))
    close = difflib.get_close_matches(wanted, unique, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    listed = ", ".join(unique) if unique else "none"
    return f"{hint}known: {listed}"


LOOPBACK = ("127.0.0.1", "localhost", "::1")  # listen addresses only the host itself reaches


def probe_address(listen: str) -> str:
    """The address on its host that reaches a server or router listening on ``listen``: what
    the probes (through the transport) and the host's agent dial.

    A specific address is dialled as it is (``10.0.4.22``, ``::1``, a name the host
    resolves; brackets dropped). A wildcard is dialled on the loopback of its family:
    ``0.0.0.0`` at ``127.0.0.1``, ``::`` at ``::1`` (uvicorn binds ``::`` IPv6-only, as
    asyncio's ``create_server`` does). ``localhost`` is dialled at ``127.0.0.1``.
    """
    address = listen.strip().strip("[]")
    if address in ("0.0.0.0", "localhost", ""):
        return "127.0.0.1"
    if address == "::":
        return "::1"
    return address


def worker_url(router: RouterConfig, server: str, server_host: str, server_port: int,
               server_listen: str, host_address: str | None) -> str:
    """The URL ``router`` reaches ``server`` at (see ``RouterConfig``)."""
    if server in router.worker_urls:
        return router.worker_urls[server]
    if server_host == router.host:
        address = probe_address(server_listen)  # dialled on that host, as the probes do
    elif server_listen not in ("0.0.0.0", "::", *LOOPBACK):
        address = server_listen
    else:
        address = host_address or server_host
    if ":" in address:
        address = f"[{address}]"
    return f"http://{address}:{server_port}"

"""The configuration: a TOML file, overridden by ``LAUNCHER_*`` environment variables and
systemd credentials. This module holds the schema and the problems; ``config_sources`` holds
where values come from (pydantic-settings sources).

Entry points:

- ``load_config(path, environ=...)`` reads the file, applies the overrides and validates
  everything. Bad input of any kind raises one ``ConfigError`` whose ``problems`` list every
  problem found, each as ``toml.path: message`` (``servers[1].gpus: ...``), ending in
  ``(from LAUNCHER_...)`` when an override set the value.
- ``config_from_dict(data, environ=...)`` does the same for an already parsed table.
- ``resolve_secret_env(server, environ)`` reads the values of a server's ``secret_env``.

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
import tomllib
import types
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from launcher.durations import format_duration, parse_duration
from launcher.errors import ConfigError
from launcher.params import LaunchParams
from launcher.sglang.flags import OWNED_FLAGS
from launcher.sglang.phases import Phase
from launcher.sglang.versions import MAMBA_RADIX_SPELLING_FROM, at_least

__all__ = [
    "ENV_PREFIX",
    "SGLANG_HEALTH_TIMEOUT_S",
    "Config",
    "HostConfig",
    "MetricsConfig",
    "PolicyConfig",
    "PolicyOverride",
    "ServerConfig",
    "SlackConfig",
    "StallBudgets",
    "StallOverride",
    "config_from_dict",
    "default_state_dir",
    "load_config",
    "resolve_secret_env",
]

ENV_PREFIX = "LAUNCHER_"
ENV_DELIMITER = "__"
# systemd sets it to the directory of the unit's LoadCredential= files.
_CREDENTIALS_VAR = "CREDENTIALS_DIRECTORY"
# SGLang's /health answers 503 after SGLANG_HEALTH_CHECK_TIMEOUT (20 s); a probe that gives up
# sooner would call a slow-but-healthy server dead.
SGLANG_HEALTH_TIMEOUT_S = 20.0

Loc = tuple[str | int, ...]
_M = TypeVar("_M", bound=BaseModel)

_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+(\.post\d+)?$")
_SECRET_KEY_RE = re.compile(r"TOKEN|KEY|SECRET|PASSWORD", re.IGNORECASE)
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
    estimate_margin: Annotated[float, Field(ge=0.0, le=2.0)] = 0.15
    stall: StallBudgets = Field(default_factory=StallBudgets)


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
    ``secret_env`` values are references, ``env:VAR`` or ``file:/path`` on this machine; read
    them with ``resolve_secret_env``. ``run_dir`` ``None`` means the host's.
    """

    name: Name
    host: str
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
    command: Program = Field(default_factory=lambda: ["python3", "-m", "sglang.launch_server"])
    sglang_version: str | None = None
    run_dir: RemoteDir | None = None
    probe: Literal["tunnel", "direct"] = "tunnel"
    policy: PolicyOverride = Field(default_factory=PolicyOverride)

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

    def webhook_url(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The webhook URL, or None when the variable is unset or empty.

        Raises ConfigError when ``webhook_url_file`` is set but cannot be read or is empty.
        """
        if self.webhook is not None:
            return self.webhook.get_secret_value().strip() or None
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


# --- root --------------------------------------------------------------------------------


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
    read the sources (file, environment, credentials: ``config_sources``) and check the
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

    def server(self, name: str) -> ServerConfig:
        """The server called ``name``; ConfigError (with did-you-mean) if there is none."""
        for server in self.servers:
            if server.name == name:
                return server
        raise ConfigError(
            [f"servers: no server named {name!r}; {_known([s.name for s in self.servers], name)}"]
        )

    def host(self, name: str) -> HostConfig:
        """The host called ``name``; ConfigError (with did-you-mean) if there is none."""
        for host in self.hosts:
            if host.name == name:
                return host
        raise ConfigError(
            [f"hosts: no host named {name!r}; {_known([h.name for h in self.hosts], name)}"]
        )

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
        """The load's sources (``config_sources.sources``); only ``init_settings`` outside one."""
        from launcher.config_sources import sources

        return sources(settings_cls, init_settings)

    @model_validator(mode="before")
    @classmethod
    def _remember_input(cls, data: Any) -> Any:
        # The cross-entry checks read the merged input, which only exists in here.
        from launcher.config_sources import active_load

        load = active_load()
        if load is not None and isinstance(data, dict):
            load.tree = copy.deepcopy(data)
        return data


# --- loading -----------------------------------------------------------------------------


def load_config(path: Path, *, environ: Mapping[str, str] | None = None) -> Config:
    """Read, override from ``environ`` (default ``os.environ``; ``$CREDENTIALS_DIRECTORY`` in it
    adds the credential files) and validate the TOML at ``path``.

    Error handling: any problem with the input (unreadable file, TOML syntax, not UTF-8, bad
    values, bad overrides, cross-entry clashes) raises one ConfigError with ``source=str(path)``
    and every problem found in ``problems``. Nothing else is raised for bad input.
    """
    from launcher.config_sources import TomlFile

    return _load(lambda cls: TomlFile(cls, Path(path)), environ, str(path))


def config_from_dict(
    data: Mapping[str, Any], *, environ: Mapping[str, str] | None = None, source: str = "config"
) -> Config:
    """Validate an already parsed TOML table; same overrides and errors as ``load_config``."""
    table = copy.deepcopy(dict(data))
    return _load(lambda cls: InitSettingsSource(cls, table), environ, source)


def _load(
    file: Callable[[type[BaseSettings]], PydanticBaseSettingsSource],
    environ: Mapping[str, str] | None,
    source: str,
) -> Config:
    from launcher.config_sources import Load, loading

    load = Load(environ=os.environ if environ is None else environ, file=file)
    found: list[tuple[Loc, str]] = []
    config: Config | None = None
    with loading(load):
        try:
            config = Config()
        except ValidationError as exc:
            found.extend(_pydantic_problem(error) for error in exc.errors())
        except SettingsError as exc:  # the credentials directory itself is unusable
            raise ConfigError([f"${_CREDENTIALS_VAR}: {exc}"], source=source) from None
        except ConfigError as exc:  # the file: already worded, with its name as source
            raise ConfigError(exc.problems, source=source) from None
    found.extend(_cross_checks(load.tree or {}))
    found.extend(_control_characters(load.tree or {}, ()))
    found.extend(_secrets_in_file(load.file_data))

    problems = list(load.problems)  # overrides that could not be placed, worded with the name
    for loc, message in found:
        line = f"{_path(loc)}: {message}"
        names = [name for path, name in load.origins.items() if _related(path, loc)]
        if names:
            line += f" (from {', '.join(sorted(set(names)))})"
        if line not in problems:
            problems.append(line)
    if problems:
        raise ConfigError(problems, source=source)
    assert config is not None  # no problems means pydantic accepted it
    return config


def _secrets_in_file(data: Mapping[str, Any]) -> Iterator[tuple[Loc, str]]:
    slack = data.get("slack")
    if isinstance(slack, dict) and "webhook" in slack:
        yield (
            ("slack", "webhook"),
            "the webhook URL is a secret; do not write it in the config: give it as the "
            "credential LAUNCHER_SLACK__WEBHOOK (systemd LoadCredential=) or the environment "
            "variable of that name, or use webhook_url_file / webhook_url_env",
        )


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
    values: dict[str, str] = {}
    problems: list[str] = []
    for key, ref in server.secret_env.items():
        field = f"servers[{server.name}].secret_env.{key}"
        kind, _, target = ref.partition(":")
        if kind == "env":
            value = env.get(target, "")
            if not value:
                state = "is empty" if target in env else "is not set"
                problems.append(f"{field}: environment variable {target} {state} on this machine")
                continue
            values[key] = value
        elif kind == "cred":
            directory = env.get(_CREDENTIALS_VAR, "")
            if not directory:
                problems.append(
                    f"{field}: credential {target}: ${_CREDENTIALS_VAR} is not set on this "
                    f"machine (systemd sets it for LoadCredential={target}:/path in the unit)"
                )
                continue
            try:
                values[key] = _read_secret_file(Path(directory) / target, field, server.name)
            except ConfigError as exc:
                problems.extend(exc.problems)
        else:
            try:
                values[key] = _read_secret_file(Path(target), field, server.name)
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


def _toml_problem(exc: tomllib.TOMLDecodeError) -> str:
    text = str(exc)
    match = re.search(r"\s*\(at line (\d+), column (\d+)\)$", text)
    if match:
        return f"line {match[1]}, column {match[2]}: TOML syntax: {text[: match.start()]}"
    match = re.search(r"\s*\(at end of document\)$", text)
    if match:
        return f"end of file: TOML syntax: {text[: match.start()]}"
    return f"TOML syntax: {text}"


# --- problems ----------------------------------------------------------------------------


def _path(loc: Loc) -> str:
    """('servers', 1, 'gpus') -> 'servers[1].gpus'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _related(override: Loc, loc: Loc) -> bool:
    shorter = min(len(override), len(loc))
    return shorter > 0 and override[:shorter] == loc[:shorter]


_COMPARISONS = {
    "greater_than": ("gt", ">"),
    "greater_than_equal": ("ge", ">="),
    "less_than": ("lt", "<"),
    "less_than_equal": ("le", "<="),
}


def _pydantic_problem(error: ErrorDetails) -> tuple[Loc, str]:
    loc: Loc = tuple(error["loc"])
    kind = error["type"]
    ctx = error.get("ctx") or {}
    value = error.get("input")
    if kind == "extra_forbidden":
        return loc, _unknown_key(loc)
    if kind == "missing":
        return loc, "required key is missing"
    if kind in _COMPARISONS:
        key, op = _COMPARISONS[kind]
        limit = ctx.get(key)
        shown = f"{limit:g}" if isinstance(limit, float) else str(limit)
        return loc, f"{_show(value)} is not {op} {shown}"
    if kind in ("value_error", "assertion_error"):
        return loc, error["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return loc, f"expected a table, got {_show(value, loc)}"
    if kind == "list_type":
        return loc, f"expected an array, got {_show(value, loc)}"
    message = error["msg"]
    return loc, f"{message[:1].lower()}{message[1:]} (got {_show(value, loc)})"


def _show(value: object, loc: Loc = ()) -> str:
    if "env" in loc or "secret_env" in loc:
        return "a value not shown"  # may hold a secret
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _known(names: Sequence[str], wanted: str) -> str:
    unique = list(dict.fromkeys(names))
    close = difflib.get_close_matches(wanted, unique, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    listed = ", ".join(unique) if unique else "none"
    return f"{hint}known: {listed}"


def _unknown_key(loc: Loc) -> str:
    key = str(loc[-1])
    model = _model_at(loc[:-1])
    choices = list(model.model_fields) if model is not None else []
    close = difflib.get_close_matches(key, choices, n=1)
    if close:
        return f"unknown key; did you mean {close[0]!r}?"
    return f"unknown key; expected one of: {', '.join(choices)}" if choices else "unknown key"


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _unwrap(annotation: Any) -> Any:
    origin = get_origin(annotation)
    if origin is Annotated:
        return _unwrap(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        args = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(args) == 1:
            return _unwrap(args[0])
    return annotation


def _annotation_at(loc: Sequence[str | int]) -> Any:
    """The (unwrapped) type that lives at ``loc`` inside ``Config``, or None if none does."""
    current: Any = Config
    for part in loc:
        current = _unwrap(current)
        origin = get_origin(current)
        if isinstance(part, int):
            if origin is not list:
                return None
            current = get_args(current)[0]
        elif isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(part)
            if field is None:
                return None
            current = field.annotation
        elif origin is dict:
            current = get_args(current)[1]
        else:
            return None
    return _unwrap(current)


def _model_at(loc: Sequence[str | int]) -> type[BaseModel] | None:
    found = _annotation_at(loc)
    if isinstance(found, type) and issubclass(found, BaseModel):
        return found
    return None


# --- cross-entry checks ------------------------------------------------------------------


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _control_characters(node: Any, loc: Loc) -> Iterator[tuple[Loc, str]]:
    """Every string (key or value) holding a control character other than tab and newline:
    a NUL cannot pass through exec or SSH, the others only hide what a value really is."""
    items: Any = (node.items() if isinstance(node, Mapping)
                  else enumerate(node) if isinstance(node, list) else ())
    for key, value in items:
        at = (*loc, key)
        for text in (key, value):
            if isinstance(text, str) and (m := _CONTROL.search(text)):
                yield at, (f"contains the control character {m.group()!r} at position "
                           f"{m.start()}: remove it")
        if isinstance(value, Mapping | list):
            yield from _control_characters(value, at)


def _cross_checks(tree: Mapping[str, Any]) -> Iterator[tuple[Loc, str]]:
    """Rules spanning several fields or entries.

    Each entry is validated on its own, with the keys pydantic rejected dropped, so one bad
    value does not hide the other problems of its entry or of the others. A rule is skipped
    when a key it reads was dropped (the default standing in would give false alarms).
    """
    policy = _partial(PolicyConfig, tree.get("policy", {}))
    global_problems = set(_policy_problems(*policy)) if policy else set()
    for loc, message in sorted(global_problems, key=str):
        yield ("policy", *loc), message
    raw_hosts = tree.get("hosts", [])
    host_entries = raw_hosts if isinstance(raw_hosts, list) else []
    host_names = [h["name"] for h in host_entries if isinstance(h, dict) and "name" in h]
    hosts = yield from _check_hosts(host_entries)
    yield from _check_servers(tree.get("servers", []), host_names, hosts, policy, global_problems)


def _check_hosts(entries: list[Any]) -> Generator[tuple[Loc, str], None, dict[str, HostConfig]]:
    hosts: dict[str, HostConfig] = {}
    yield from _duplicate_names("hosts", entries)
    for index, raw in enumerate(entries):
        partial = _partial(HostConfig, raw)
        if partial is None:
            continue
        host, bad = partial
        hosts.setdefault(host.name, host)
        if host.transport == "ssh" and not host.address and not bad & {"transport", "address"}:
            yield ("hosts", index, "address"), "required when transport = 'ssh'"
        if "env" not in bad:
            yield from _inline_secrets(host.env, ("hosts", index, "env"))
    return hosts


def _check_servers(
    raw_servers: object,
    host_names: list[Any],
    hosts: Mapping[str, HostConfig],
    policy: tuple[PolicyConfig, frozenset[str]] | None,
    global_problems: set[tuple[Loc, str]],
) -> Iterator[tuple[Loc, str]]:
    entries = raw_servers if isinstance(raw_servers, list) else []
    yield from _duplicate_names("servers", entries)
    ports: dict[tuple[str, int], tuple[int, str]] = {}
    gpus_in_use: dict[tuple[str, int], tuple[int, str]] = {}
    for index, raw in enumerate(entries):
        at: Loc = ("servers", index)
        host_ref = raw.get("host") if isinstance(raw, dict) else None
        if isinstance(host_ref, str) and host_ref not in host_names:
            known = [str(name) for name in host_names]
            yield (*at, "host"), f"unknown host {host_ref!r}; {_known(known, host_ref)}"
        partial = _partial(ServerConfig, raw)
        if partial is None:
            continue
        server, bad = partial
        need = server.tp * server.dp
        if len(server.gpus) != need and not bad & {"tp", "dp", "gpus"}:
            yield (
                (*at, "gpus"),
                f"lists {len(server.gpus)} GPU(s) but tp*dp = {server.tp}*{server.dp} = {need}; "
                f"list exactly {need}",
            )
        if "env" not in bad:
            yield from _inline_secrets(server.env, (*at, "env"))
        if "port" not in bad:
            other = ports.setdefault((server.host, server.port), (index, server.name))
            if other[0] != index:
                yield (
                    (*at, "port"),
                    f"port {server.port} on host {server.host!r} is also used by "
                    f"servers[{other[0]}] ({other[1]!r})",
                )
        for gpu in server.gpus if "gpus" not in bad else []:
            other = gpus_in_use.setdefault((server.host, gpu), (index, server.name))
            if other[0] != index:
                yield (
                    (*at, "gpus"),
                    f"GPU {gpu} on host {server.host!r} is also used by "
                    f"servers[{other[0]}] ({other[1]!r})",
                )
        host = hosts.get(server.host)
        if (
            server.probe == "direct"
            and host is not None
            and host.transport == "ssh"
            and server.listen in ("127.0.0.1", "localhost", "::1")
            and not bad & {"probe", "listen"}
        ):
            yield (
                (*at, "probe"),
                f"'direct' probes connect from this machine, but listen = {server.listen!r} "
                "only accepts connections on the host itself; use probe = 'tunnel' or a "
                "reachable listen address",
            )
        if policy is not None and "policy" not in bad:
            merged = server.policy.applied_to(policy[0])
            for loc, message in _policy_problems(merged, policy[1]):
                if (loc, message) not in global_problems:
                    yield (*at, "policy", *loc), message


def _duplicate_names(section: str, entries: Sequence[object]) -> Iterator[tuple[Loc, str]]:
    seen: dict[str, int] = {}
    for index, raw in enumerate(entries):
        name = raw.get("name") if isinstance(raw, dict) else None
        if isinstance(name, str):
            first = seen.setdefault(name, index)
            if first != index:
                yield (
                    (section, index, "name"),
                    f"{name!r} is already the name of {section}[{first}]",
                )


def _partial(model: type[_M], raw: object) -> tuple[_M, frozenset[str]] | None:
    """``raw`` validated as ``model`` after dropping the top-level keys that fail, with the set
    of dropped keys; None when it is not a table or a required key fails."""
    if not isinstance(raw, dict):
        return None
    try:
        return model.model_validate(raw), frozenset()
    except ValidationError as exc:
        bad = frozenset(str(error["loc"][0]) for error in exc.errors() if error["loc"])
    try:
        return model.model_validate({k: v for k, v in raw.items() if k not in bad}), bad
    except ValidationError:
        return None  # a required key was bad; its problem is reported by the full validation


def _policy_problems(policy: PolicyConfig, bad: frozenset[str]) -> list[tuple[Loc, str]]:
    problems: list[tuple[Loc, str]] = []
    if policy.mem_fraction_ceiling <= policy.mem_fraction_floor and not bad & {
        "mem_fraction_floor",
        "mem_fraction_ceiling",
    }:
        problems.append(
            (
                ("mem_fraction_ceiling",),
                f"{policy.mem_fraction_ceiling} is not > mem_fraction_floor "
                f"({policy.mem_fraction_floor})",
            )
        )
    if policy.restart_backoff_max < policy.restart_backoff_initial and not bad & {
        "restart_backoff_initial",
        "restart_backoff_max",
    }:
        problems.append(
            (
                ("restart_backoff_max",),
                f"{format_duration(policy.restart_backoff_max)} is less than "
                f"restart_backoff_initial ({format_duration(policy.restart_backoff_initial)})",
            )
        )
    return problems


def _inline_secrets(env: Mapping[str, str], at: Loc) -> Iterator[tuple[Loc, str]]:
    for key in env:
        if _SECRET_KEY_RE.search(key):
            yield (
                (*at, key),
                "looks like a secret written inline; put it in secret_env instead "
                f'({key} = "env:{key}" or "file:/path") so it is read on this machine '
                "and never stored in the config",
            )

"""The configuration's problems: pydantic's errors worded as ``toml.path: message``, and the
cross-entry checks (unique names, known hosts, GPU and port clashes, routers that can reach
their servers, ...) that validation of one model alone cannot do.

``launcher.config.load`` runs these over the merged input after pydantic has validated it; every
function yields or returns ``(loc, message)`` pairs, ``loc`` a TOML path as a tuple
(``('servers', 1, 'gpus')``), which ``toml_path`` renders. Pure: no I/O, no environment.
"""

from __future__ import annotations

import difflib
import itertools
import re
import types
from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from launcher.config.schema import (
    LOOPBACK,
    ROUTER_PROMETHEUS_PORT,
    Config,
    HostConfig,
    Loc,
    PolicyConfig,
    RouterConfig,
    ServerConfig,
    did_you_mean,
)
from launcher.durations import format_duration

_M = TypeVar("_M", bound=BaseModel)
_SECRET_KEY_RE = re.compile(r"TOKEN|KEY|SECRET|PASSWORD", re.IGNORECASE)


# --- problems ----------------------------------------------------------------------------


def toml_path(loc: Loc) -> str:
    """('servers', 1, 'gpus') -> 'servers[1].gpus'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


_COMPARISONS = {
    "greater_than": ("gt", ">"),
    "greater_than_equal": ("ge", ">="),
    "less_than": ("lt", "<"),
    "less_than_equal": ("le", "<="),
}


def pydantic_problem(error: ErrorDetails) -> tuple[Loc, str]:
    """One pydantic validation error as (where, message), worded for a person editing TOML."""
    loc: Loc = tuple(error["loc"])
    kind = error["type"]
    ctx = error.get("ctx") or {}
    value = error.get("input")
    if kind == "extra_forbidden":
        return loc, unknown_key(loc)
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


def unknown_key(loc: Loc) -> str:
    """The message for a key ``loc[-1]`` that the table at ``loc[:-1]`` does not have: the
    closest known key, else every known key."""
    key = str(loc[-1])
    model = _model_at(loc[:-1])
    choices = list(model.model_fields) if model is not None else []
    close = difflib.get_close_matches(key, choices, n=1)
    if close:
        return f"unknown key; did you mean {close[0]!r}?"
    return f"unknown key; expected one of: {', '.join(choices)}" if choices else "unknown key"


def is_model(annotation: Any) -> bool:
    """True when ``annotation`` is a table of the schema (a pydantic model class)."""
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def unwrap(annotation: Any) -> Any:
    """``annotation`` without ``Annotated`` metadata and without ``| None``."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return unwrap(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        args = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(args) == 1:
            return unwrap(args[0])
    return annotation


def annotation_at(loc: Sequence[str | int]) -> Any:
    """The (unwrapped) type that lives at ``loc`` inside ``Config``, or None if none does."""
    current: Any = Config
    for part in loc:
        current = unwrap(current)
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
    return unwrap(current)


def _model_at(loc: Sequence[str | int]) -> type[BaseModel] | None:
    found = annotation_at(loc)
    if isinstance(found, type) and issubclass(found, BaseModel):
        return found
    return None


# --- cross-entry checks ------------------------------------------------------------------


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def control_characters(node: Any, loc: Loc) -> Iterator[tuple[Loc, str]]:
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
            yield from control_characters(value, at)


def cross_checks(tree: Mapping[str, Any]) -> Iterator[tuple[Loc, str]]:
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
    yield from _check_routers(tree, host_names, hosts)


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
            yield (*at, "host"), f"unknown host {host_ref!r}; {did_you_mean(known, host_ref)}"
        yield from _node_problems(raw, at, host_names)
        partial = _partial(ServerConfig, raw)
        if partial is None:
            continue
        server, bad = partial
        need, nnodes = server.tp * server.dp, server.nnodes
        if need % nnodes and not bad & {"tp", "dp", "nodes"}:
            yield ((*at, "tp"), f"tp*dp = {need} does not split evenly over {nnodes} nodes")
        elif len(server.gpus) * nnodes != need and not bad & {"tp", "dp", "gpus", "nodes"}:
            per = f" per node ({need // nnodes} on each of {nnodes} nodes)" if nnodes > 1 else ""
            yield (
                (*at, "gpus"),
                f"lists {len(server.gpus)} GPU(s) but tp*dp = {server.tp}*{server.dp} = {need}; "
                f"list exactly {need // nnodes}{per}",
            )
        if "env" not in bad:
            yield from _inline_secrets(server.env, (*at, "env"))
        # Ranks >= 1 bind the same port (SGLang's dummy /health): every node counts.
        for node in server.node_hosts if "port" not in bad else []:
            other = ports.setdefault((node, server.port), (index, server.name))
            if other[0] != index:
                yield (
                    (*at, "port"),
                    f"port {server.port} on host {node!r} is also used by "
                    f"servers[{other[0]}] ({other[1]!r})",
                )
        for node, gpu in itertools.product(server.node_hosts,
                                           server.gpus if "gpus" not in bad else []):
            other = gpus_in_use.setdefault((node, gpu), (index, server.name))
            if other[0] != index:
                yield (
                    (*at, "gpus"),
                    f"GPU {gpu} on host {node!r} is also used by "
                    f"servers[{other[0]}] ({other[1]!r})",
                )
        if policy is not None and "policy" not in bad:
            merged = server.policy.applied_to(policy[0])
            for loc, message in _policy_problems(merged, policy[1]):
                if (loc, message) not in global_problems:
                    yield (*at, "policy", *loc), message


def _node_problems(raw: object, at: Loc, host_names: list[Any]) -> Iterator[tuple[Loc, str]]:
    """The multi-node keys of one raw ``[[servers]]`` table: ``nodes`` instead of ``host``,
    known hosts, and a rendezvous address when there is more than one node."""
    if not isinstance(raw, dict):
        return
    nodes = raw.get("nodes")
    if "nodes" in raw and "host" in raw:
        yield ((*at, "nodes"), "set either host or nodes, not both: nodes lists every host "
               "of the server in rank order, node 0 first")
    if not isinstance(nodes, list):
        for key in ("dist_init_port", "dist_init_addr", "gated_launch_port"):
            if key in raw and "nodes" not in raw:
                yield (*at, key), "is only used with nodes = [...] (a multi-node server)"
        return
    for j, ref in enumerate(nodes):
        if isinstance(ref, str) and ref not in host_names:
            known = [str(name) for name in host_names]
            yield (*at, "nodes", j), f"unknown host {ref!r}; {did_you_mean(known, ref)}"
    if len(nodes) > 1 and "dist_init_port" not in raw and "dist_init_addr" not in raw:
        yield ((*at, "dist_init_port"), "required with more than one node: the port of the "
               "torch rendezvous on node 0 (--dist-init-addr), e.g. dist_init_port = 5000; "
               "or give dist_init_addr = 'HOST:PORT'")


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
    of dropped keys; None when it is not a table or a required key fails. An unknown key
    counts its closest known key as bad too (``tpp`` for ``tp``): the default that stands in
    for what was meant would only raise follow-on problems."""
    if not isinstance(raw, dict):
        return None
    try:
        return model.model_validate(raw), frozenset()
    except ValidationError as exc:
        errors = [error for error in exc.errors() if error["loc"]]
        meant = {close for error in errors if error["type"] == "extra_forbidden"
                 for close in difflib.get_close_matches(str(error["loc"][0]),
                                                        list(model.model_fields), n=1)}
        bad = frozenset(str(error["loc"][0]) for error in errors) | meant
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


def _check_routers(
    tree: Mapping[str, Any], host_names: list[Any], hosts: Mapping[str, HostConfig],
) -> Iterator[tuple[Loc, str]]:
    """Router rules: known host and servers, names apart from the servers' (both name run
    directories on hosts), no port clash on a host, and servers the router can reach."""
    raw_routers = tree.get("routers", [])
    entries = raw_routers if isinstance(raw_routers, list) else []
    yield from _duplicate_names("routers", entries)
    raw_servers = tree.get("servers", [])
    servers = {
        raw["name"]: raw for raw in (raw_servers if isinstance(raw_servers, list) else [])
        if isinstance(raw, dict) and isinstance(raw.get("name"), str)
    }
    taken: dict[tuple[str, int], str] = {}
    for name, raw in servers.items():
        host = _server_host(raw)
        port = raw.get("port", 30000)
        if isinstance(host, str) and isinstance(port, int):
            taken.setdefault((host, port), f"server {name!r}")
    for index, raw in enumerate(entries):
        at: Loc = ("routers", index)
        partial = _partial(RouterConfig, raw)
        if partial is None:
            continue
        router, bad = partial
        if router.name in servers:
            yield (*at, "name"), (f"{router.name!r} is also the name of a server; routers and "
                                  "servers need distinct names (each names a run directory)")
        if "host" not in bad and router.host not in host_names:
            known = [str(n) for n in host_names]
            yield (*at, "host"), f"unknown host {router.host!r}; {did_you_mean(known, router.host)}"
        if "port" not in bad and "host" not in bad:
            other = taken.setdefault((router.host, router.port), f"routers[{index}]")
            if other != f"routers[{index}]":
                yield (*at, "port"), (f"port {router.port} on host {router.host!r} is also "
                                      f"used by {other}")
        if "args" not in bad and "host" not in bad and "--prometheus-port" not in " ".join(
                router.args):
            key = (router.host, -ROUTER_PROMETHEUS_PORT)  # a slot apart from the TCP ports
            other = taken.setdefault(key, f"routers[{index}]")
            if other != f"routers[{index}]":
                yield (*at, "args"), (
                    f"{other} on host {router.host!r} already uses the router's default "
                    f"Prometheus port {ROUTER_PROMETHEUS_PORT}; add \"--prometheus-port\", "
                    "\"PORT\" to args")
        if "servers" not in bad:
            yield from _router_servers(router, at, servers, hosts, bad)
        for name in router.worker_urls if "worker_urls" not in bad else []:
            if name not in router.servers:
                yield (*at, "worker_urls", name), f"{name!r} is not in this router's servers"


def _server_host(raw: Mapping[str, Any]) -> object:
    """The server's host (node 0's for a server that spans several nodes)."""
    nodes = raw.get("nodes")
    if isinstance(nodes, list) and nodes:
        return nodes[0]
    return raw.get("host")


def _router_servers(router: RouterConfig, at: Loc, servers: Mapping[str, Mapping[str, Any]],
                    hosts: Mapping[str, HostConfig], bad: frozenset[str],
                    ) -> Iterator[tuple[Loc, str]]:
    seen: set[str] = set()
    for j, name in enumerate(router.servers):
        loc: Loc = (*at, "servers", j)
        if name in seen:
            yield loc, f"{name!r} is listed twice"
            continue
        seen.add(name)
        raw = servers.get(name)
        if raw is None:
            yield loc, f"unknown server {name!r}; {did_you_mean(list(servers), name)}"
            continue
        host, listen = _server_host(raw), raw.get("listen", "127.0.0.1")
        if (isinstance(host, str) and host != router.host and "host" not in bad
                and listen in LOOPBACK and name not in router.worker_urls):
            yield loc, (
                f"server {name!r} listens on {listen} of host {host!r}, which the router on "
                f"{router.host!r} cannot reach; set its listen to an address the router can "
                f"reach, or give worker_urls.{name}")

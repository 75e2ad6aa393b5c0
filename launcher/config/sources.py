"""Where the configuration's values come from: pydantic-settings sources for ``Config``.

``Config`` is a ``BaseSettings``. While ``load_config`` / ``config_from_dict`` run (inside
``loading(Load(...))``), its ``settings_customise_sources`` returns ``Load.sources(...)``,
highest precedence first:

1. ``EntryOverrides`` over the environment: ``LAUNCHER_SERVERS__<index|name>__KEY`` and
   ``LAUNCHER_HOSTS__...``, overrides of one entry of an array of tables, addressed by index or
   by its ``name`` (pydantic-settings' env source can only address tables, not array entries);
2. ``EnvOverrides``: pydantic-settings' ``EnvSettingsSource`` (prefix ``LAUNCHER_``, nested
   delimiter ``__``, names case-insensitive, JSON for tables and arrays) for every other key;
3. and 4. the same two over credential files: ``CredentialOverrides`` is pydantic-settings'
   ``NestedSecretsSettingsSource`` with ``secrets_dir = $CREDENTIALS_DIRECTORY`` (systemd's
   ``LoadCredential=``), so a credential file named ``LAUNCHER_SLACK__WEBHOOK`` acts like the
   environment variable of that name, below the real environment;
5. the file: ``TomlFile`` (pydantic-settings' ``TomlConfigSettingsSource`` with the project's
   error messages) or, for ``config_from_dict``, the already parsed table;
6. defaults that depend on the environment (``state_dir``, see ``default_state_dir``).

Outside a load, ``Config(...)`` built in code takes only its keyword arguments: nothing is read
from ``os.environ`` behind a caller's back.

Every override records which variable or credential set which path (``Load.origins``), so a
problem can end in ``(from LAUNCHER_SERVERS__LLAMA__PORT)``; an override that cannot be placed
at all is a problem of its own, worded with its name (``Load.problems``).
"""

from __future__ import annotations

import copy
import json
import re
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args, get_origin

from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SecretsSettingsSource,
    TomlConfigSettingsSource,
)
from pydantic_settings.sources import NestedSecretsSettingsSource
from pydantic_settings.sources.utils import parse_env_vars

from launcher.config.problems import (
    annotation_at,
    is_model,
    toml_path,
    unknown_key,
    unwrap,
)
from launcher.config.schema import (
    CREDENTIALS_VAR,
    ENV_DELIMITER,
    ENV_PREFIX,
    LOADING,
    Config,
    Loc,
    default_state_dir,
    did_you_mean,
)
from launcher.errors import ConfigError

if TYPE_CHECKING:
    from pydantic_settings.sources.types import ConfigFileSourceType, Traversable

__all__ = [
    "CredentialOverrides",
    "EntryOverrides",
    "EnvOverrides",
    "Load",
    "TomlFile",
    "credentials_dir",
    "loading",
]

FileSource = Callable[[type[BaseSettings]], PydanticBaseSettingsSource]


@dataclass
class Load:
    """The inputs and findings of one load.

    ``file`` builds the file's source; ``problems`` are overrides that could not be placed,
    already worded with their name; ``origins`` maps each path an override set to its name
    (``LAUNCHER_X`` or ``credential LAUNCHER_X``); ``file_data`` is the file's table and
    ``tree`` the merged input the root validator saw (None if validation never started).
    """

    environ: Mapping[str, str]
    file: FileSource
    problems: list[str] = field(default_factory=list)
    origins: dict[Loc, str] = field(default_factory=dict)
    file_data: dict[str, Any] = field(default_factory=dict)
    tree: dict[str, Any] | None = None

    def sources(
        self, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The sources of ``Config``, highest precedence first (see the module docstring)."""
        file_source = self.file(settings_cls)
        self.file_data = file_source()
        defaults = InitSettingsSource(
            settings_cls, {"state_dir": str(default_state_dir(self.environ))}
        )
        below: list[PydanticBaseSettingsSource] = [file_source, defaults]
        directory = credentials_dir(self.environ)
        if directory is not None:
            credentials = CredentialOverrides(settings_cls, self, directory)
            credential_entries = EntryOverrides(
                settings_cls, self, credentials.entries, "credential ", [credentials, *below]
            )
            below = [credential_entries, credentials, *below]
        env = EnvOverrides(settings_cls, self, self.environ)
        env_entries = EntryOverrides(settings_cls, self, env.entries, "", [env, *below])
        return (env_entries, env, *below)


@contextmanager
def loading(load: Load) -> Iterator[Load]:
    """Make ``load`` the one ``Config()`` reads its sources from, for the ``with`` block."""
    token = LOADING.set(load)
    try:
        yield load
    finally:
        LOADING.reset(token)


def credentials_dir(environ: Mapping[str, str]) -> Path | None:
    """``$CREDENTIALS_DIRECTORY`` from ``environ``, or None when unset or empty."""
    value = environ.get(CREDENTIALS_VAR, "")
    return Path(value) if value else None


def _split(
    names: Mapping[str, str], label: str, load: Load
) -> tuple[dict[str, str], dict[str, str]]:
    """``names`` (variables or credential files) that are overrides, as (names for
    pydantic-settings' env source, names of array entries for ``EntryOverrides``).

    A name without ``__`` that is not a top-level key is not an override (e.g.
    ``LAUNCHER_SLACK_WEBHOOK``) and is left alone. Malformed overrides (unknown top-level key,
    empty key, a value that starts like JSON but does not parse) go to ``load.problems``.
    """
    plain: dict[str, str] = {}
    entries: dict[str, str] = {}
    for name in sorted(names):
        if not name.upper().startswith(ENV_PREFIX):
            continue
        segments = name[len(ENV_PREFIX) :].split(ENV_DELIMITER)
        top = segments[0].lower()
        if top not in _fields():
            if len(segments) > 1:
                problem = f"{toml_path((top,))}: {unknown_key((top,))}"
                load.problems.append(f"{problem} (from {label}{name})")
            continue
        if any(not segment for segment in segments):
            load.problems.append(f"{label}{name}: empty key between '__' delimiters")
            continue
        text = names[name]
        if _json_wanted(segments, text):
            try:
                json.loads(text)
            except json.JSONDecodeError as exc:
                load.problems.append(
                    f"{label}{name}: value starts like JSON but does not parse: {exc}"
                )
                continue
        if len(segments) > 1 and get_origin(annotation_at((top,))) is list:
            entries[name] = text
        else:
            plain[name] = text
            load.origins[tuple(segment.lower() for segment in segments)] = f"{label}{name}"
    return plain, entries


def _json_wanted(segments: Sequence[str], text: str) -> bool:
    """Whether ``text`` for the key ``segments`` names is JSON: it starts with ``[`` or ``{``
    and the key holds a table or an array (or is unknown), so "[::1]:9400" stays text."""
    if not text.lstrip().startswith(("[", "{")):
        return False
    current: Any = annotation_at(())
    for segment in segments:
        if current is None:
            return True
        origin = get_origin(current)
        if origin is list:
            current = unwrap(get_args(current)[0])
        elif origin is dict:
            current = unwrap(get_args(current)[1])
        elif is_model(current):
            found = current.model_fields.get(segment.lower())
            current = None if found is None else unwrap(found.annotation)
        else:
            return False  # below a plain value: placing it reports the problem
    return current is None or get_origin(current) in (list, dict) or is_model(current)


def _fields() -> Mapping[str, FieldInfo]:
    return Config.model_fields


class EnvOverrides(EnvSettingsSource):
    """pydantic-settings' environment source over an injected mapping (tests pass their own),
    for every override except array entries (``entries`` keeps those for ``EntryOverrides``).

    A value that is not JSON for a table or array key is passed on as text, so validation
    reports it ("expected a table, got 'x'") with the variable, instead of a bare SettingsError.
    """

    def __init__(
        self, settings_cls: type[BaseSettings], load: Load, names: Mapping[str, str]
    ) -> None:
        self._names, self.entries = _split(names, "", load)
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(
            self._names, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str
        )

    def decode_complex_value(self, field_name: str, field: FieldInfo, value: Any) -> Any:
        try:
            return super().decode_complex_value(field_name, field, value)
        except ValueError:
            return value


class CredentialOverrides(NestedSecretsSettingsSource):
    """pydantic-settings' nested secrets source over ``$CREDENTIALS_DIRECTORY``: a file named
    ``LAUNCHER_SLACK__WEBHOOK`` sets ``slack.webhook`` as that variable would. Files are read
    by pydantic-settings (hidden entries skipped, nothing outside the directory followed,
    16 MiB in all); other file names (``cred:NAME`` references of ``secret_env``) are ignored
    here. A missing directory is an error (``SettingsError``)."""

    def __init__(self, settings_cls: type[BaseSettings], load: Load, directory: Path) -> None:
        self._load = load
        self.entries: dict[str, str] = {}
        super().__init__(
            SecretsSettingsSource(settings_cls, secrets_dir=directory),
            secrets_dir=directory,
            secrets_dir_missing="error",
        )

    def _load_env_vars(self) -> Mapping[str, str | None]:
        found: dict[str, str] = {}
        for path in self.secrets_paths:
            found.update(self.load_secrets(path))
        plain, self.entries = _split(found, "credential ", self._load)
        return parse_env_vars(plain, self.case_sensitive, False, None)

    def decode_complex_value(self, field_name: str, field: FieldInfo, value: Any) -> Any:
        try:
            return super().decode_complex_value(field_name, field, value)
        except ValueError:
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


class TomlFile(TomlConfigSettingsSource):
    """pydantic-settings' TOML source for one file that must exist, with the project's errors:
    a ConfigError naming the file and the line (unreadable, not UTF-8, TOML syntax)."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path) -> None:
        super().__init__(settings_cls, toml_file=path)

    def _read_files(
        self, files: ConfigFileSourceType | None, deep_merge: bool = False
    ) -> dict[str, Any]:
        # The base class skips a missing file (an empty config); launcher's file is required.
        assert isinstance(files, Path)
        return self._read_file(files)

    def _read_file(self, file_path: Path | Traversable) -> dict[str, Any]:
        source = str(file_path)
        try:
            raw = file_path.read_bytes()
        except OSError as exc:
            raise ConfigError(
                [f"cannot read the file: {exc.strerror or exc}"], source=source
            ) from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw[: exc.start].count(b"\n") + 1
            raise ConfigError(
                [f"line {line}: not UTF-8 text ({exc.reason})"], source=source
            ) from None
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError([_toml_problem(exc)], source=source) from None


class EntryOverrides(PydanticBaseSettingsSource):
    """Overrides of one entry of an array of tables: ``LAUNCHER_SERVERS__0__PORT`` or, by the
    entry's ``name`` (case-insensitive), ``LAUNCHER_SERVERS__LLAMA__PORT``.

    The array is the one the sources ``beneath`` give (the first that has it: a whole-array
    override, else the file); the result is that array with these overrides placed, which
    replaces it (pydantic-settings merges tables key by key but replaces arrays). Values that
    start with ``[`` or ``{`` are JSON, all others text that validation converts; a JSON table
    for a table merges into it. Overrides that cannot be placed (no such entry, descending into
    a plain value) go to ``load.problems`` with their name.
    """

    def __init__(
        self,
        settings_cls: type[BaseSettings],
        load: Load,
        names: Mapping[str, str],
        label: str,
        beneath: Sequence[PydanticBaseSettingsSource],
    ) -> None:
        super().__init__(settings_cls)
        self._load = load
        self._names = dict(names)
        self._label = label
        self._beneath = list(beneath)
        self._result: dict[str, Any] | None = None

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # __call__ builds whole arrays instead

    def __call__(self) -> dict[str, Any]:
        # Called more than once (a higher source reads it as its base): place things once.
        if self._result is None:
            self._result = self._build()
        return self._result

    def _build(self) -> dict[str, Any]:
        tree: dict[str, Any] = {}
        for name in sorted(self._names):
            segments = name[len(ENV_PREFIX) :].split(ENV_DELIMITER)
            top = segments[0].lower()
            if top not in tree:
                base = self._base(top)
                if base is not None:
                    tree[top] = copy.deepcopy(base)
            try:
                loc = _place(tree, segments, _value(segments, self._names[name]))
            except _PlacementError as exc:
                self._load.problems.append(f"{self._label}{name}: {exc}")
                continue
            self._load.origins[loc] = f"{self._label}{name}"
        return tree

    def _base(self, key: str) -> Any:
        for source in self._beneath:
            data = source()
            if key in data:
                return data[key]
        return None


class _PlacementError(Exception):
    pass


def _value(segments: Sequence[str], text: str) -> Any:
    # _split already rejected JSON-looking text that does not parse.
    return json.loads(text) if _json_wanted(segments, text) else text


def _place(tree: dict[str, Any], segments: Sequence[str], value: Any) -> Loc:
    node: Any = tree
    loc: Loc = ()
    for position, segment in enumerate(segments):
        last = position == len(segments) - 1
        kind = annotation_at(loc)
        key: str | int
        if get_origin(kind) is list:
            if not isinstance(node, list) or not node:
                raise _PlacementError(f"{toml_path(loc)} has no entries to override")
            key = _entry_index(node, segment, loc)
        elif get_origin(kind) is dict:
            key = segment  # free-form tables (env) keep the variable's spelling
        else:
            key = segment.lower()
        if last:
            if isinstance(node[key] if _has(node, key) else None, dict) and isinstance(value, dict):
                _deep_merge(node[key], value)
            else:
                node[key] = value
        else:
            child_kind = annotation_at((*loc, key))
            if _is_scalar(child_kind):
                raise _PlacementError(f"{toml_path((*loc, key))} is not a table")
            if not _has(node, key):
                if get_origin(child_kind) is list:
                    raise _PlacementError(f"{toml_path((*loc, key))} has no entries to override")
                node[key] = {}
            child = node[key]
            if not isinstance(child, dict | list):
                raise _PlacementError(f"{toml_path((*loc, key))} is not a table or an array")
            node = child
        loc = (*loc, key)
    return loc


def _is_scalar(annotation: Any) -> bool:
    """True for a known key that holds a plain value (not a table, array or free-form map)."""
    if annotation is None:
        return False  # unknown key: pydantic reports it, with did-you-mean
    if get_origin(annotation) in (list, dict):
        return False
    return not is_model(annotation)


def _has(node: Any, key: str | int) -> bool:
    if isinstance(node, list):
        return isinstance(key, int) and 0 <= key < len(node)
    return isinstance(node, dict) and key in node


def _entry_index(entries: list[Any], segment: str, loc: Loc) -> int:
    names = [entry.get("name") if isinstance(entry, dict) else None for entry in entries]
    if segment.isdigit():
        index = int(segment)
        if index < len(entries):
            return index
        raise _PlacementError(f"{toml_path(loc)} has no entry {index} (there are {len(entries)})")
    for index, name in enumerate(names):
        if isinstance(name, str) and name.lower() == segment.lower():
            return index
    known = [n for n in names if isinstance(n, str)]
    raise _PlacementError(
        f"{toml_path(loc)} has no entry named {segment.lower()!r}; "
        f"{did_you_mean(known, segment.lower())} (or use an index)"
    )


def _deep_merge(target: dict[str, Any], changes: Mapping[str, Any]) -> None:
    for key, value in changes.items():
        if isinstance(target.get(key), dict) and isinstance(value, dict):
            _deep_merge(target[key], value)
        else:
            target[key] = value

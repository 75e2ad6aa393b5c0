"""Loading the configuration: ``load_config`` reads a TOML file, ``config_from_dict`` takes an
already parsed table. Both read the overrides (``launcher.config.sources``), validate
(``launcher.config.schema``) and run the cross-entry checks (``launcher.config.problems``),
and raise one ``ConfigError`` that lists every problem found.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsError,
)

from launcher.config.problems import (
    control_characters,
    cross_checks,
    pydantic_problem,
    toml_path,
)
from launcher.config.schema import CREDENTIALS_VAR, Config, Loc
from launcher.config.sources import Load, TomlFile, loading
from launcher.errors import ConfigError

__all__ = ["config_from_dict", "load_config"]


def load_config(path: Path, *, environ: Mapping[str, str] | None = None) -> Config:
    """Read, override from ``environ`` (default ``os.environ``; ``$CREDENTIALS_DIRECTORY`` in it
    adds the credential files) and validate the TOML at ``path``.

    Error handling: any problem with the input (unreadable file, TOML syntax, not UTF-8, bad
    values, bad overrides, cross-entry clashes) raises one ConfigError with ``source=str(path)``
    and every problem found in ``problems``. Nothing else is raised for bad input.
    """
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
    load = Load(environ=os.environ if environ is None else environ, file=file)
    found: list[tuple[Loc, str]] = []
    config: Config | None = None
    with loading(load):
        try:
            config = Config()
        except ValidationError as exc:
            found.extend(pydantic_problem(error) for error in exc.errors())
        except SettingsError as exc:  # the credentials directory itself is unusable
            raise ConfigError([f"${CREDENTIALS_VAR}: {exc}"], source=source) from None
        except ConfigError as exc:  # the file: already worded, with its name as source
            raise ConfigError(exc.problems, source=source) from None
    found.extend(cross_checks(load.tree or {}))
    found.extend(control_characters(load.tree or {}, ()))
    found.extend(_secrets_in_file(load.file_data))

    problems = list(load.problems)  # overrides that could not be placed, worded with the name
    for loc, message in found:
        line = f"{toml_path(loc)}: {message}"
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


def _related(override: Loc, loc: Loc) -> bool:
    shorter = min(len(override), len(loc))
    return shorter > 0 and override[:shorter] == loc[:shorter]

"""Fixes that SGLang's own error messages prescribe, in the dialect of the server's version.

SGLang 0.5.10 rejects speculative decoding on a hybrid model with ``no_buffer`` and the radix
cache with "... please use --mamba-scheduler-strategy extra_buffer and set
SGLANG_ENABLE_SPEC_V2=1." The log parser keeps what such a message asks for
(``Numbers.prescribed_mamba_strategy`` / ``prescribed_env``); ``prescription`` turns it into a
change for the server's SGLang version: the strategy always (rendered as
``--mamba-scheduler-strategy`` up to 0.5.10, ``--mamba-radix-cache-strategy`` from 0.5.15), an
environment variable only if that version still reads it (0.5.23 ignores
``SGLANG_ENABLE_SPEC_V2``). SGLang 0.5.23 no longer raises that error (its ``auto`` strategy
resolves to ``extra_buffer`` under the default overlap schedule); a forced ``no_buffer`` with the
overlap schedule on fails ``validate_mamba_no_buffer`` with "Try to set
disable_overlap_schedule=True.", which prescribes ``--disable-overlap-schedule`` (the
``disable_overlap_schedule`` key). ``Prescription.toml`` shows it as the config change to make;
``Prescription.apply`` gives the params of a relaunch that applies it
(``[policy] apply_prescribed_fixes``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from launcher.params import LaunchParams
from launcher.sglang.flags import env_is_read, mamba_strategy_flag
from launcher.sglang.outcome import Numbers

if TYPE_CHECKING:
    from collections.abc import Mapping


__all__ = ["Prescription", "ServerLike", "prescription"]


class ServerLike(Protocol):
    """What :meth:`Prescription.toml` reads of a configured server (``config.ServerConfig``)."""

    @property
    def name(self) -> str: ...

    @property
    def env(self) -> Mapping[str, str]: ...


@dataclass(frozen=True)
class Prescription:
    """A config change an SGLang error names, checked against ``sglang_version``."""

    sglang_version: str
    mamba_strategy: str | None = None
    disable_overlap_schedule: bool = False
    env: tuple[tuple[str, str], ...] = ()  # the variables this version reads
    ignored_env: tuple[str, ...] = ()  # named by the error, but this version ignores them

    @property
    def flags(self) -> list[str]:
        """The SGLang flags the change renders to on this version."""
        out = []
        if self.mamba_strategy is not None:
            out += [mamba_strategy_flag(self.sglang_version), self.mamba_strategy]
        if self.disable_overlap_schedule:
            out.append("--disable-overlap-schedule")
        return out

    def describe(self) -> str:
        """One line: the flags and env settings, and what was left out and why."""
        parts = []
        if self.flags:
            parts.append(" ".join(self.flags))
        parts.extend(f"{k}={v}" for k, v in self.env)
        text = " and ".join(parts) or "nothing"
        if self.ignored_env:
            text += (f" ({', '.join(self.ignored_env)} left out: SGLang {self.sglang_version} "
                     "no longer reads it)")
        return text

    def apply(self, params: LaunchParams) -> LaunchParams:
        """``params`` with the change made."""
        out = params
        if self.mamba_strategy is not None:
            out = replace(out, mamba_strategy=self.mamba_strategy)
        if self.disable_overlap_schedule:
            out = replace(out, disable_overlap_schedule=True)
        for name, value in self.env:
            out = out.with_env(name, value)
        return out

    def applied_in(self, params: LaunchParams) -> bool:
        """Whether ``params`` already carry the change."""
        return self.apply(params) == params

    def toml(self, server: ServerLike | None = None) -> str:
        """The change as a config snippet: the server's table with the fields to set (its
        existing ``env`` merged), with a comment saying the flag it renders to."""
        lines = [f"# SGLang {self.sglang_version}: {self.describe()}", "[[servers]]"]
        if server is not None:
            lines.append(f"name = {json.dumps(server.name)}")
        if self.mamba_strategy is not None:
            lines.append(f"mamba_strategy = {json.dumps(self.mamba_strategy)}")
        if self.disable_overlap_schedule:
            lines.append("disable_overlap_schedule = true")
        if self.env:
            env = dict(server.env) if server is not None else {}
            env.update(dict(self.env))
            body = ", ".join(f"{k} = {json.dumps(v)}" for k, v in sorted(env.items()))
            lines.append(f"env = {{ {body} }}")
        return "\n".join(lines)


def prescription(numbers: Numbers, sglang_version: str) -> Prescription | None:
    """The fix ``numbers`` say SGLang's error prescribed, for ``sglang_version``; None if none."""
    if (
        numbers.prescribed_mamba_strategy is None
        and not numbers.prescribed_env
        and not numbers.prescribed_disable_overlap
    ):
        return None
    env: list[tuple[str, str]] = []
    ignored: list[str] = []
    for item in (numbers.prescribed_env or "").split(","):
        if "=" not in item:
            continue
        name, value = item.split("=", 1)
        if env_is_read(name, sglang_version):
            env.append((name, value))
        else:
            ignored.append(name)
    return Prescription(
        sglang_version=sglang_version,
        mamba_strategy=numbers.prescribed_mamba_strategy,
        disable_overlap_schedule=bool(numbers.prescribed_disable_overlap),
        env=tuple(sorted(env)),
        ignored_env=tuple(ignored),
    )

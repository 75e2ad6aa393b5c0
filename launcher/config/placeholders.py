"""``{config_dir}`` and ``{python}`` in a config, so a shipped config works from any clone.

``{config_dir}`` is the directory of the config file; ``{python}`` is the interpreter running
launcher (for the embedded simulator on a local host). They are expanded in model paths,
commands (routers' too), run directories, nvidia-smi commands and env values, and nowhere
else.
"""

from __future__ import annotations

import sys
from pathlib import Path

from launcher.config.schema import Config


def expand_placeholders(config: Config, config_path: Path) -> Config:
    """A copy of ``config`` with the placeholders replaced."""
    values = {"config_dir": str(config_path.resolve().parent), "python": sys.executable}

    def sub(text: str) -> str:
        for key, value in values.items():
            text = text.replace("{" + key + "}", value)
        return text

    hosts = [
        h.model_copy(
            update={
                "run_dir": sub(h.run_dir),
                "nvidia_smi": [sub(a) for a in h.nvidia_smi],
                "env": {k: sub(v) for k, v in h.env.items()},
            }
        )
        for h in config.hosts
    ]
    servers = [
        s.model_copy(
            update={
                "model_path": sub(s.model_path),
                "command": [sub(a) for a in s.command],
                "run_dir": sub(s.run_dir) if s.run_dir else None,
                "env": {k: sub(v) for k, v in s.env.items()},
            }
        )
        for s in config.servers
    ]
    routers = [
        r.model_copy(
            update={
                "command": [sub(a) for a in r.command],
                "run_dir": sub(r.run_dir) if r.run_dir else None,
                "env": {k: sub(v) for k, v in r.env.items()},
            }
        )
        for r in config.routers
    ]
    state_dir = Path(sub(str(config.state_dir)))
    return config.model_copy(update={"hosts": hosts, "servers": servers, "routers": routers,
                                     "state_dir": state_dir})

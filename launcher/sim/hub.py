"""The Hugging Face Hub as the simulated SGLang sees it: no network, only the host's HF cache.

SGLang hands a ``--model-path`` (``--speculative-draft-model-path``, a ``--lora-paths``
adapter) that is not an existing directory to transformers / huggingface_hub as a Hub repo id
(0.5.10 and 0.5.23 alike: ``get_config`` -> ``AutoConfig.from_pretrained(model,
revision=...)``, the weights through ``snapshot_download``). Those look the repo up on the Hub
and, when it cannot be reached (or ``HF_HUB_OFFLINE`` is set), fall back to the snapshot in the
cache. The simulator never reaches the Hub, so with or without ``HF_HUB_OFFLINE`` a repo id
resolves to its cached snapshot, or fails as transformers does when neither is there (the
caller raises; :func:`launcher.sim.logfmt.hf_offline_error` is the text).

The cache layout and environment are huggingface_hub's (``constants.py``: ``HF_HUB_CACHE``,
else the legacy ``HUGGINGFACE_HUB_CACHE``, else ``$HF_HOME/hub``, ``HF_HOME`` defaulting to
``$XDG_CACHE_HOME/huggingface`` or ``~/.cache/huggingface``; ``_snapshot_download.py``:
``models--org--name/refs/<branch or tag>`` holds the commit, ``snapshots/<commit>/`` the
files, a 40-hex revision is a commit itself).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

DEFAULT_REVISION = "main"

# huggingface_hub utils/_validators.py validate_repo_id: "name" or "namespace/name", word
# characters, "-" and "."; no "--" or ".."; not ending in ".git".
_REPO_ID = re.compile(r"(\b[\w\-.]{1,96}\b/)?\b[\w\-.]{1,96}\b")
_COMMIT = re.compile(r"[0-9a-f]{40}")  # huggingface_hub constants.REGEX_COMMIT_HASH


def is_repo_id(path: str) -> bool:
    """Whether huggingface_hub accepts ``path`` as a repo id (``validate_repo_id``)."""
    return (
        _REPO_ID.fullmatch(path) is not None
        and "--" not in path
        and ".." not in path
        and not path.endswith(".git")
    )


def offline(env: Mapping[str, str] | None = None) -> bool:
    """huggingface_hub's ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``): 1/ON/YES/TRUE."""
    e = os.environ if env is None else env
    value = e.get("HF_HUB_OFFLINE") or e.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in ("1", "ON", "YES", "TRUE")


def hub_cache(env: Mapping[str, str]) -> Path:
    """The HF cache directory the environment ``env`` selects (huggingface_hub's rule)."""

    def expand(value: str) -> Path:
        return Path(os.path.expandvars(os.path.expanduser(value)))

    if env.get("HF_HUB_CACHE"):
        return expand(env["HF_HUB_CACHE"])
    if env.get("HUGGINGFACE_HUB_CACHE"):
        return expand(env["HUGGINGFACE_HUB_CACHE"])
    if env.get("HF_HOME"):
        return expand(env["HF_HOME"]) / "hub"
    xdg = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return expand(xdg) / "huggingface" / "hub"


def snapshot(repo_id: str, revision: str | None = None,
             env: Mapping[str, str] | None = None) -> Path | None:
    """The cached snapshot directory of model repo ``repo_id`` at ``revision`` (a branch, tag
    or commit; default ``main``), or None when the cache does not hold it. ``env``: the
    process environment (default ``os.environ``)."""
    rev = revision or DEFAULT_REVISION
    if not is_repo_id(repo_id) or any(part in ("", ".", "..") for part in rev.split("/")):
        return None
    storage = hub_cache(os.environ if env is None else env) / (
        "models--" + repo_id.replace("/", "--"))
    commit = rev
    if _COMMIT.fullmatch(rev) is None:
        ref = storage / "refs" / rev
        if not ref.is_file():
            return None
        commit = ref.read_text().strip()
    found = storage / "snapshots" / commit
    return found if commit and found.is_dir() else None

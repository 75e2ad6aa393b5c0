"""A model, draft or LoRA adapter given as a Hugging Face Hub id is read from the host's HF
cache (launcher/host/facts.py ``model_dir``), over the real local transport, from a temporary
cache laid out as huggingface_hub lays it out: ``models--org--name/refs/<branch>`` holds the
commit, ``snapshots/<commit>/`` the files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import anyio
import pytest

from launcher.config.load import config_from_dict
from launcher.host.facts import HOST_HUB, HubCache, hub_id, model_dir, read_lora, read_model
from launcher.host.transport.local import LocalTransport
from launcher.sglang.modelfacts import ModelFacts, NoEstimate

CASE = (Path(__file__).resolve().parents[1] / "fixtures" / "real_startups"
        / "docs-llama31-8b-lora-h100-tp1-mf0874-bs4-20250827")
COMMIT = "0e9e39f249a16976918f6564b8830bc894c89659"


def _snapshot(cache: Path, repo: str, commit: str = COMMIT, branch: str | None = "main",
              files: dict[str, str] | None = None) -> Path:
    d = cache / ("models--" + repo.replace("/", "--"))
    snap = d / "snapshots" / commit
    snap.mkdir(parents=True)
    if branch is not None:
        (d / "refs").mkdir(exist_ok=True)
        (d / "refs" / branch).write_text(commit)  # huggingface_hub writes no newline
    for name, text in (files or {}).items():
        (snap / name).write_text(text)
    return snap


def _model_files() -> dict[str, str]:
    return {"config.json": (CASE / "config.json").read_text(),
            "model.safetensors.index.json": json.dumps({"metadata": {"total_size": 16060522496},
                                                        "weight_map": {}})}


def _dir(path: str, *, revision: str = "main", hub: HubCache = HOST_HUB,
         env: dict[str, str] | None = None) -> str:
    return anyio.run(lambda: model_dir(LocalTransport("local", env=env or {}), path,
                                       revision=revision, hub=hub))


@pytest.mark.parametrize(("path", "is_hub"), [
    ("meta-llama/Llama-3.1-8B-Instruct", True), ("Qwen/Qwen3-8B", True),
    ("/models/Llama-3.1-8B", False), ("~/models/x", False), ("./org/name", False),
    ("org/name/sub", False), ("org/na--me", False), ("org/..", False), ("name", False),
])
def test_a_hub_id_is_told_from_a_directory(path: str, is_hub: bool) -> None:
    assert hub_id(path) is is_hub


def test_a_hub_id_is_read_from_the_servers_hf_home(tmp_path: Path) -> None:
    """HF_HOME in the server's env: <HF_HOME>/hub; refs/main names the snapshot read."""
    snap = _snapshot(tmp_path / "hf" / "hub", "meta-llama/Llama-3.1-8B-Instruct",
                     files=_model_files())
    found = _dir("meta-llama/Llama-3.1-8B-Instruct", hub=HubCache(hf_home=str(tmp_path / "hf")))
    assert found == str(snap)
    model, weights = anyio.run(read_model, LocalTransport("local"), found)
    assert model.hidden_size == 4096 and weights.total_bytes == 16060522496


def test_hf_hub_cache_wins_over_hf_home_and_the_hosts_env_is_the_fallback(
    tmp_path: Path,
) -> None:
    a = _snapshot(tmp_path / "a", "org/m")
    b = _snapshot(tmp_path / "b" / "hub", "org/m")
    assert _dir("org/m", hub=HubCache(hub_cache=str(tmp_path / "a"),
                                      hf_home=str(tmp_path / "b"))) == str(a)
    # nothing in the server's env: the host's (the transport's) HF_HOME
    assert _dir("org/m", env={"HF_HOME": str(tmp_path / "b")}) == str(b)
    assert _dir("org/m", env={"HF_HUB_CACHE": str(tmp_path / "a"),
                              "HF_HOME": str(tmp_path / "b")}) == str(a)
    assert _dir("org/m", env={"HUGGINGFACE_HUB_CACHE": str(tmp_path / "a"),  # the older name
                              "HF_HOME": str(tmp_path / "b")}) == str(a)


def test_the_cache_is_found_as_huggingface_hub_finds_it(tmp_path: Path) -> None:
    """HF_HUB_CACHE (server's, then host's) over the older HUGGINGFACE_HUB_CACHE over
    HF_HOME/hub over ${XDG_CACHE_HOME:-~/.cache}/huggingface/hub."""
    a = _snapshot(tmp_path / "a", "org/m")
    legacy = _snapshot(tmp_path / "legacy", "org/m")
    xdg = _snapshot(tmp_path / "xdg" / "huggingface" / "hub", "org/m")
    home = _snapshot(tmp_path / "home" / ".cache" / "huggingface" / "hub", "org/m")
    # the server sets only the older name, the host the newer: the newer wins, as in the server
    assert _dir("org/m", hub=HubCache(legacy_hub_cache=str(tmp_path / "legacy")),
                env={"HF_HUB_CACHE": str(tmp_path / "a")}) == str(a)
    assert _dir("org/m", hub=HubCache(legacy_hub_cache=str(tmp_path / "legacy"))) == str(legacy)
    assert _dir("org/m", env={"XDG_CACHE_HOME": str(tmp_path / "xdg")}) == str(xdg)
    assert _dir("org/m", env={"HOME": str(tmp_path / "home")}) == str(home)


def test_a_relative_directory_of_a_hub_ids_shape_is_that_directory(tmp_path: Path) -> None:
    """SGLang looks for a directory first; the server starts in $HOME."""
    (tmp_path / "models" / "Llama-3-8B").mkdir(parents=True)
    _snapshot(tmp_path / "hub", "models/Llama-3-8B")
    found = _dir("models/Llama-3-8B", hub=HubCache(hub_cache=str(tmp_path / "hub")),
                 env={"HOME": str(tmp_path)})
    assert found == str(tmp_path / "models" / "Llama-3-8B")


def test_a_revision_is_a_branch_or_a_commit(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    _snapshot(cache, "org/m")
    dev = _snapshot(cache, "org/m", commit="1111111111111111111111111111111111111111",
                    branch="dev")
    hub = HubCache(hub_cache=str(cache))
    assert _dir("org/m", revision="dev", hub=hub) == str(dev)
    assert _dir("org/m", revision="1111111111111111111111111111111111111111", hub=hub) == str(dev)
    with pytest.raises(NoEstimate, match="not a branch, tag or commit"):
        _dir("org/m", revision="../../etc", hub=hub)


def test_a_hub_id_not_downloaded_says_so_and_how_to_fix_it(tmp_path: Path) -> None:
    with pytest.raises(NoEstimate) as exc:
        _dir("Qwen/Qwen3-8B", hub=HubCache(hub_cache=str(tmp_path)))
    text = str(exc.value)
    assert "not in the Hugging Face cache" in text and str(tmp_path) in text
    assert "huggingface-cli download Qwen/Qwen3-8B" in text


def test_a_directory_is_read_as_it_is(tmp_path: Path) -> None:
    assert _dir(str(tmp_path)) == str(tmp_path)  # no lookup, even if it does not exist


def test_lora_adapters_given_as_hub_ids_are_read_from_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "hf" / "hub"
    _snapshot(cache, "org/adapter", files={"adapter_config.json": json.dumps(
        {"r": 16, "target_modules": ["q_proj", "v_proj"]})})
    cfg = config_from_dict({
        "state_dir": str(tmp_path), "hosts": [{"name": "h", "transport": "local"}],
        "servers": [{"name": "s", "host": "h", "model_path": "/m", "gpus": [0], "port": 1,
                     "env": {"HF_HOME": str(tmp_path / "hf")},
                     "extra_args": ["--lora-paths", "a=org/adapter"]}],
    }, environ={})
    model = ModelFacts.from_config(json.loads((CASE / "config.json").read_text()))
    shape = anyio.run(read_lora, LocalTransport("local"), cfg.servers[0], "0.5.23", model)
    assert shape is not None and shape.max_lora_rank == 16
    assert shape.target_modules == {"qkv_proj"}
    shutil.rmtree(cache)
    with pytest.raises(NoEstimate, match="not in the Hugging Face cache"):
        anyio.run(read_lora, LocalTransport("local"), cfg.servers[0], "0.5.23", model)

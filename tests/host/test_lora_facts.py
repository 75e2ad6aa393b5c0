"""The LoRA adapters' configs read on the host (launcher/host/facts.py ``read_lora``) over the
real local transport, from temporary adapter directories: the shape SGLang would resolve, and a
NoEstimate naming the path and the fix for an adapter launcher cannot read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from launcher.config.load import config_from_dict
from launcher.config.schema import ServerConfig
from launcher.host.facts import MAX_ADAPTER_CONFIG, Facts, read_lora
from launcher.host.transport.local import LocalTransport
from launcher.sglang.lora import LoraShape
from launcher.sglang.modelfacts import GpuFacts, ModelFacts, NoEstimate, ServerShape, WeightFacts

CASE = (Path(__file__).resolve().parents[1] / "fixtures" / "real_startups"
        / "docs-llama31-8b-lora-h100-tp1-mf0874-bs4-20250827")


def _model() -> ModelFacts:
    return ModelFacts.from_config(json.loads((CASE / "config.json").read_text()))


def _server(tmp_path: Path, extra: list[str]) -> ServerConfig:
    cfg = config_from_dict({
        "state_dir": str(tmp_path), "hosts": [{"name": "h", "transport": "local"}],
        "servers": [{"name": "s", "host": "h", "model_path": "/m", "gpus": [0], "port": 1,
                     "extra_args": extra}],
    }, environ={})
    return cfg.servers[0]


def _adapter(root: Path, name: str, config: Any) -> Path:
    d = root / name
    d.mkdir()
    (d / "adapter_config.json").write_text(
        config if isinstance(config, str) else json.dumps(config))
    return d


def _read(tmp_path: Path, extra: list[str]) -> LoraShape | None:
    server = _server(tmp_path, extra)
    return anyio.run(read_lora, LocalTransport("local"), server, "0.5.23", _model())


def test_adapter_configs_give_the_pool_and_the_estimate(tmp_path: Path) -> None:
    a = _adapter(tmp_path, "a", {"r": 256, "target_modules": ["q_proj", "k_proj", "v_proj",
                                                              "o_proj"]})
    b = _adapter(tmp_path, "b", {"r": 16, "target_modules": ["gate_proj", "up_proj",
                                                             "down_proj"]})
    shape = _read(tmp_path, ["--lora-paths", f"a={a}", str(b), "--max-loras-per-batch", "2"])
    assert shape is not None
    assert (shape.max_loras_per_batch, shape.max_lora_rank) == (2, 256)
    assert shape.target_modules == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}
    facts = Facts(_model(), WeightFacts(16060522496), [GpuFacts(0, 79.65)],
                  ServerShape(sglang_version="0.5.23"), lora=shape)
    e = facts.estimate()
    assert e.lora_gib == pytest.approx(2.50)  # rank 256 x 2 slots x 5,242,880 B
    assert e.lora is not None and "adapter_config.json" in e.lora.describe()


def test_no_lora_flags_reads_nothing_and_set_flags_read_no_adapter(tmp_path: Path) -> None:
    assert _read(tmp_path, ["--context-length", "8192"]) is None
    # both shape flags set: the adapters are not read (this path does not even exist)
    shape = _read(tmp_path, ["--lora-paths", "/nowhere/adapter", "--max-lora-rank", "8",
                             "--lora-target-modules", "q_proj", "v_proj"])
    assert shape == LoraShape(8, 8, frozenset({"qkv_proj"}), "flags")


@pytest.mark.parametrize(
    ("config", "why"),
    [
        (None, "does not exist on local"),
        ("{not json", "is not valid JSON"),
        ({"target_modules": ["q_proj"]}, "has no rank r"),
        (" " * (MAX_ADAPTER_CONFIG + 1), "larger than 1 MiB"),
    ],
)
def test_an_unreadable_adapter_names_the_path_and_the_fix(
    tmp_path: Path, config: Any, why: str
) -> None:
    path = tmp_path / "bad"
    if config is None:
        path.mkdir()
    else:
        _adapter(tmp_path, "bad", config)
    with pytest.raises(NoEstimate) as exc:
        _read(tmp_path, ["--lora-paths", f"bad={path}", "--max-lora-rank", "8"])
    text = str(exc.value)
    assert why in text and f"{path}/adapter_config.json" in text
    assert "--max-lora-rank" in text and "--lora-target-modules" in text

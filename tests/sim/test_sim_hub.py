"""The simulated SGLang on Hugging Face Hub ids (launcher/sim/hub.py, launcher/sim/model.py
``model_directory``): a ``--model-path`` (draft, LoRA adapter) given as ``org/name`` is read from
its snapshot in the HF cache the server's environment selects (HF_HOME here), as transformers /
huggingface_hub resolve it without a network; an uncached one fails at start-up with
transformers' own error text, which launcher classifies as ``model_not_found`` (fatal: no
retry). End to end: a supervised sim server comes up from the cache, and ``launcher plan
--json`` prints an estimate for it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from launcher.sglang.classify import RETRYABLE, diagnose_text
from launcher.sglang.outcome import Outcome
from launcher.sim import hub, logfmt
from launcher.sim.model import ConfigFailure, scenario_from_argv
from launcher.supervise.lifecycle import State
from tests.simhost import READY_LINE, free_port, make_sim_host, model_dir
from tests.supervise import SimSetup, run_cli, supervise

pytestmark = pytest.mark.timeout(120)

COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO_ID = "acme/tiny-1b"
# transformers 5.24.0 utils/hub.py cached_files, printed verbatim by
# AutoConfig.from_pretrained("acme/tiny-llama") with an empty HF_HOME, with HF_HUB_OFFLINE=1
# and, without it, on a host without name resolution (the same two lines); the same two lines
# end tests/data/logs/v0523_model_not_found_offline.log.
TRANSFORMERS_OFFLINE = (
    "OSError: We couldn't connect to 'https://huggingface.co' to load the files, and couldn't "
    "find them in the cached files.\nCheck your internet connection or see how to run the "
    "library in offline mode at "
    "'https://huggingface.co/docs/transformers/installation#offline-mode'."
)


def cache_snapshot(hf_home: Path, repo_id: str = REPO_ID, *, ref: str = "main",
                   source: Path | None = None) -> Path:
    """Put ``source`` (default: the shipped tiny-1b-sim model) into ``hf_home``'s HF cache as
    huggingface_hub lays out a download of ``repo_id``: refs/<ref> names the commit."""
    repo = hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / COMMIT
    shutil.copytree(source or model_dir("tiny-1b-sim"), snap)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / ref).write_text(COMMIT)
    return snap


def hf_env(hf_home: Path) -> dict[str, str]:
    # HF_HOME decides only when no HF_HUB_CACHE is set (huggingface_hub's order)
    return {"HF_HOME": str(hf_home), "HF_HUB_CACHE": "", "HUGGINGFACE_HUB_CACHE": ""}


def test_the_cache_layout_and_environment_are_huggingface_hubs(tmp_path: Path) -> None:
    snap = cache_snapshot(tmp_path / "hf", ref="v1")
    env = hf_env(tmp_path / "hf")
    assert hub.snapshot(REPO_ID, "v1", env) == snap
    assert hub.snapshot(REPO_ID, COMMIT, env) == snap  # a commit needs no ref
    assert hub.snapshot(REPO_ID, None, env) is None  # no refs/main
    assert hub.snapshot(REPO_ID, "../v1", env) is None
    assert hub.hub_cache({"HF_HUB_CACHE": "/c", "HF_HOME": "/h"}) == Path("/c")
    assert hub.hub_cache({"HF_HOME": "/h"}) == Path("/h/hub")
    assert hub.hub_cache({"XDG_CACHE_HOME": "/x"}) == Path("/x/huggingface/hub")
    assert hub.is_repo_id("Qwen/Qwen3-8B") and not hub.is_repo_id("a--b/c")
    assert hub.offline({"HF_HUB_OFFLINE": "1"}) and not hub.offline({"HF_HUB_OFFLINE": "0"})


def test_a_cached_hub_id_loads_at_its_revision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache_snapshot(tmp_path / "hf", ref="v1")
    for k, v in hf_env(tmp_path / "hf").items():
        monkeypatch.setenv(k, v)
    scen, _ = scenario_from_argv("0.5.23", ["--model-path", REPO_ID, "--revision", "v1"], 79.19)
    direct, _ = scenario_from_argv(
        "0.5.23", ["--model-path", str(model_dir("tiny-1b-sim"))], 79.19)
    assert scen == direct
    # main is not in the cache: SGLang fails as transformers does
    with pytest.raises(ConfigFailure) as exc:
        scenario_from_argv("0.5.23", ["--model-path", REPO_ID], 79.19)
    assert TRANSFORMERS_OFFLINE in exc.value.text


def test_an_uncached_lora_adapter_fails_with_huggingface_hubs_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang's LoRAConfig fetches a Hub adapter with snapshot_download: its
    LocalEntryNotFoundError, worded by HF_HUB_OFFLINE (huggingface_hub 2.4.0's texts)."""
    cache_snapshot(tmp_path / "hf")
    for k, v in hf_env(tmp_path / "hf").items():
        monkeypatch.setenv(k, v)
    argv = ["--model-path", REPO_ID, "--lora-paths", "acme/tiny-lora"]
    with pytest.raises(ConfigFailure) as exc:
        scenario_from_argv("0.5.23", argv, 79.19)
    assert logfmt.SNAPSHOT_UNREACHABLE in exc.value.text
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigFailure) as exc:
        scenario_from_argv("0.5.23", argv, 79.19)
    assert logfmt.SNAPSHOT_OFFLINE in exc.value.text


@pytest.mark.parametrize("version", ["0.5.10", "0.5.23"])
def test_a_sim_process_comes_up_from_the_cache_and_fails_without_it(
    tmp_path: Path, version: str
) -> None:
    host = make_sim_host(tmp_path, gpu_count=1, gpu_total_gib=79.19)
    cache_snapshot(tmp_path / "hf")
    env = hf_env(tmp_path / "hf")
    with host.start("--model-path", REPO_ID, "--port", str(free_port()), version=version,
                    env=env) as sim:
        sim.wait_for(READY_LINE, timeout=60)
    code, out = host.run("--model-path", "acme/not-downloaded", "--port", str(free_port()),
                         version=version, env=env)
    assert code == 1
    assert TRANSFORMERS_OFFLINE in out
    diagnosis = diagnose_text(out, code, sglang_version=version)
    assert diagnosis.outcome is Outcome.MODEL_NOT_FOUND
    assert Outcome.MODEL_NOT_FOUND not in RETRYABLE


async def test_a_supervised_hub_id_server_comes_up_and_an_uncached_one_gives_up(
    sim: SimSetup, tmp_path: Path
) -> None:
    cache_snapshot(tmp_path / "hf")
    config = sim.config(server={"model_path": REPO_ID, "env": hf_env(tmp_path / "hf")})
    result = await supervise(config, until=lambda rec: rec.has("server.ready"))
    assert result.events.has("server.ready"), result.events.summary()
    assert f"--model-path {REPO_ID}" in sim.cmd(1)
    sim.cleanup()

    (tmp_path / "uncached").mkdir()
    gone = SimSetup.create(tmp_path / "uncached")
    try:
        config = gone.config(server={"model_path": "acme/not-downloaded",
                                     "env": hf_env(tmp_path / "hf")})
        result = await supervise(config)
        rec = result.events
        assert State.GAVE_UP == result.state, rec.summary()
        assert ["model_not_found"] == [f["outcome"] for f in rec.of("attempt.failed")]
        assert "couldn't find them in the cached files" in rec.of("server.gave_up")[0]["reason"]
    finally:
        gone.cleanup()


def test_plan_estimates_a_hub_id_server_from_the_cache(sim: SimSetup, tmp_path: Path) -> None:
    cache_snapshot(tmp_path / "hf")
    config = sim.write_toml(sim.data(server={"model_path": REPO_ID,
                                             "env": hf_env(tmp_path / "hf")}))
    js = run_cli("plan", str(config), "--json")
    assert js.returncode == 0, js.stderr
    row = json.loads(js.stdout)[0]
    assert row["no_estimate"] is None, row["no_estimate"]
    assert row["estimate"], row

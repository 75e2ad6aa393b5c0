"""Security review 2026-12-05, findings M4, M5, L1 and L2: what launcher reads over HTTP is
bounded, the router's worker API is closed by default and can ask for a key, and secrets stay
out of argv, plan, describe, the event log, the ledger and cut log lines.

The HTTP tests run against real hostile servers (tests/hostile_http.py) and measure the peak
memory of a separate Python process (its VmHWM), never a duration.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from launcher.config.load import config_from_dict
from launcher.errors import ConfigError
from launcher.sglang.logparse import MAX_KEPT_CHARS
from launcher.untrusted import Redactor
from tests.hostile_http import HostileHttp
from tests.security.test_hardening import script_server
from tests.simhost import free_port
from tests.sshsim import kill_leftovers
from tests.supervise import SimSetup, json_lines, run_cli
from tests.supervision.test_router_e2e import router_python

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20

# -- M4: bounded answers ---------------------------------------------------------------------

_ROUTER_CALL = """
import anyio, httpx, json, sys
from launcher.host.router_api import RouterClient
async def main():
    async with httpx.AsyncClient(trust_env=False, timeout=60) as client:
        try:
            await RouterClient(client, sys.argv[1], tries=1).workers()
            error = None
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
    hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
    print(json.dumps({"error": error, "hwm_kib": int(hwm)}))
anyio.run(main)
"""

_SLACK_CALL = """
import anyio, json, sys
from launcher.hooks.slack import SlackNotifier
async def main():
    async def no_wait(_s): pass
    n = SlackNotifier(sys.argv[1], servers_info={}, max_tries=2, sleep=no_wait,
                      post_timeout_s=60)
    results = [await n._post({"text": "hi"}) for _ in range(2)]
    hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
    print(json.dumps({"causes": [r.cause for r in results], "hwm_kib": int(hwm)}))
anyio.run(main)
"""


def _measured(code: str, url: str) -> dict[str, Any]:
    """Run ``code`` against ``url`` in a fresh launcher Python; its JSON line, and its peak
    RSS growth over an idle run of the same imports (``grown_mib``)."""
    def run(target: str) -> dict[str, Any]:
        done = subprocess.run([sys.executable, "-c", code, target], capture_output=True,
                              text=True, cwd=REPO, timeout=240)
        assert 0 == done.returncode, done.stderr[-2000:]
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return result

    idle = run("http://127.0.0.1:9")  # connection refused: the imports' own footprint
    got = run(url)
    got["grown_mib"] = (got["hwm_kib"] - idle["hwm_kib"]) / 1024
    return got


def test_a_routers_gzip_bomb_is_not_inflated() -> None:
    """M4: a router answering GET /workers with 1 GiB of gzip-inflated JSON (about 1 MiB
    sent): launcher neither inflates nor parses it; its memory stays within a few MiB."""
    with HostileHttp("gzip", body_len=1 << 30) as srv:
        got = _measured(_ROUTER_CALL, f"http://127.0.0.1:{srv.port}")
    assert got["error"] is not None
    assert "gzip-encoded" in got["error"] and "not decoded" in got["error"], got
    assert got["grown_mib"] < 32, got


def test_a_routers_endless_answer_is_cut_at_the_cap() -> None:
    """M4: a router whose answer never ends (10 GiB announced, sent as fast as it goes): the
    read stops at the cap with a clear error; a bounded amount was taken."""
    with HostileHttp("huge", body_len=10 << 30) as srv:
        got = _measured(_ROUTER_CALL, f"http://127.0.0.1:{srv.port}")
        sent = srv.sent
    assert "larger than 4194304 bytes (not read further)" in got["error"], got
    assert got["grown_mib"] < 32, got
    assert sent < 256 * MIB  # socket buffers on both sides, not the body


def test_a_slack_webhooks_gzip_bomb_is_not_inflated_on_retries() -> None:
    """M4: a webhook answering 500 with 512 MiB inflated from about 0.5 MiB of gzip, twice:
    the cause names the encoding, nothing is inflated, memory stays bounded."""
    with HostileHttp("gzip", body_len=512 * MIB, status=500) as srv:
        got = _measured(_SLACK_CALL, f"http://127.0.0.1:{srv.port}/hook")
    assert all(c.startswith("HTTP 500: (gzip-encoded body") for c in got["causes"]), got
    assert got["grown_mib"] < 32, got


def test_a_slack_webhooks_endless_answer_is_read_only_to_64_kib() -> None:
    with HostileHttp("huge", body_len=10 << 30, status=500) as srv:
        got = _measured(_SLACK_CALL, f"http://127.0.0.1:{srv.port}/hook")
        sent = srv.sent
    assert all(c.startswith("HTTP 500: xxxx") for c in got["causes"]), got
    assert all(len(c) <= 220 for c in got["causes"])
    assert got["grown_mib"] < 32, got
    assert sent < 256 * MIB


# -- M5: the router's listen address and API key ---------------------------------------------


def _router_config(**router: Any) -> dict[str, Any]:
    return {
        "hosts": [{"name": "a", "address": "10.0.0.1"}],
        "servers": [{"name": "r1", "host": "a", "model_path": "/m", "gpus": [0],
                     "port": 30001}],
        "routers": [{"name": "front", "host": "a", "port": 31000, "servers": ["r1"],
                     **router}],
    }


def _problems(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, environ={})
    return info.value.problems


def test_a_router_listens_on_loopback_unless_told_and_a_wildcard_needs_a_key() -> None:
    config = config_from_dict(_router_config(), environ={})
    assert config.router("front").listen == "127.0.0.1"
    assert "127.0.0.1" == config.router("front").argv()[4]
    [problem] = _problems(_router_config(listen="0.0.0.0"))
    assert problem.startswith("routers[0]: listen '0.0.0.0' opens the router's worker API")
    assert "set api_key" in problem
    config_from_dict(_router_config(listen="0.0.0.0", api_key="env:ROUTER_KEY"), environ={})


def test_a_router_api_key_must_be_a_reference_and_never_an_argument() -> None:
    inline = "sk-router-0123456789abcdef"
    for data in (_router_config(api_key=inline),
                 _router_config(args=["--api-key", inline]),
                 _router_config(args=[f"--api-key={inline}"]),
                 _router_config(command=["python3", "-m", "sglang_router.launch_router",
                                         "--api-k", inline])):
        found = _problems(data)
        assert found and all(inline not in p for p in found), found
        assert any("api_key" in p for p in found), found
    [problem] = _problems(_router_config(api_key="env:K", command=["smg", "launch"]))
    assert "needs command to run a Python module" in problem


def test_router_with_an_api_key_registers_and_the_key_shows_nowhere(sim: SimSetup) -> None:
    """M5 with the real sglang-router 0.3.2: started with a key (handed outside argv),
    launcher registers its server with ``Authorization: Bearer``; an unauthenticated POST
    /workers gets 401; the key is in neither `plan`, the event log nor any process's argv."""
    key = "rk-" + os.urandom(12).hex()
    data = sim.data(mem_fraction_static=0.8, cuda_graph_max_bs=8)
    server = data["servers"][0]
    port = free_port()
    data["routers"] = [{
        "name": "front", "host": server["host"], "port": port, "api_key": "env:TEST_ROUTER_KEY",
        "servers": [server["name"]], "command": [router_python(), "-m",
                                                 "sglang_router.launch_router"],
        "args": ["--prometheus-port", str(free_port()), "--prometheus-host", "127.0.0.1"],
    }]
    config = sim.write_toml(data)
    env = {"TEST_ROUTER_KEY": key}
    try:
        plan = run_cli("plan", str(config), env=env)
        assert 0 == plan.returncode, plan.stderr
        up = run_cli("up", str(config), "--until-ready", "--log-format", "json", timeout=120,
                     env=env)
        assert 0 == up.returncode, up.stderr[-2000:]
        names = [e["event"] for e in json_lines(up.stdout + up.stderr) if "event" in e]
        assert "router.worker_registered" in names

        url = f"http://127.0.0.1:{port}/workers"
        with httpx.Client(trust_env=False, timeout=10) as client:
            assert 401 == client.post(url, json={"url": "http://10.9.9.9:1"}).status_code
            assert 401 == client.get(url).status_code
            listed = client.get(url, headers={"Authorization": f"Bearer {key}"}).json()
        assert [w["url"] for w in listed["workers"]] == [f"http://127.0.0.1:{server['port']}"]

        status = run_cli("status", str(config), "--json", env=env)
        [router] = [row for row in json.loads(status.stdout) if "router" in row]
        assert router["workers"] == {server["name"]: "registered"}

        ps = ["ps", "-eww", "-o", "args"]
        if os.geteuid() == 0 and shutil.which("setpriv"):
            ps = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *ps]
        args = subprocess.run(ps, capture_output=True, text=True, check=True).stdout
        assert "sglang_router.launch_router" in args  # the router is in the listing
        cmd_files = [p.read_text() for p in sim.run_dir.rglob("cmd")]
        assert cmd_files
        for sink in (plan.stdout, plan.stderr, up.stdout, up.stderr, args, status.stdout,
                     *cmd_files):
            assert key not in sink
    finally:
        run_cli("down", str(config), env=env)
        kill_leftovers([sim.run_dir])


# -- L2: secret flags ------------------------------------------------------------------------


def test_secret_flags_in_extra_args_are_refused_pointing_to_secret_args() -> None:
    data = _router_config()
    key = "sk-server-0123456789abcdef"
    data["servers"][0]["extra_args"] = ["--admin-api-key", key]
    [problem] = _problems(data)
    assert problem.startswith("servers[0].extra_args: ")
    assert "secret_args" in problem and key not in problem
    assert "every user of the host can read" in problem


def test_secret_args_reach_the_server_outside_argv_and_plan_masks_them(sim: SimSetup) -> None:
    """L2: ``secret_args`` hands ``--api-key`` to the server through its environment; the
    process gets it in sys.argv, its command line (ps, the cmd file), `plan` and the event log
    never hold it."""
    key = "sk-server-" + os.urandom(12).hex()
    module = sim.root / "probe_mod"
    module.mkdir()
    (module / "argvprobe.py").write_text(
        "import sys\nprint('argv tail', sys.argv[-2] == '--api-key' and sys.argv[-1][:10],"
        " flush=True)\nsys.exit(1)\n")
    data = sim.data(mem_fraction_static=0.8, cuda_graph_max_bs=8, server={
        "command": [sys.executable, "-m", "argvprobe"], "env": {"PYTHONPATH": str(module)}})
    data["servers"][0]["secret_args"] = {"--api-key": "env:TEST_SERVER_KEY"}
    config = sim.write_toml(data)
    env = {"TEST_SERVER_KEY": key}
    plan = run_cli("plan", str(config), env=env)
    assert 0 == plan.returncode, plan.stderr
    assert "LAUNCHER_SECRET_ARG_0=***" in plan.stdout or "LAUNCHER_SECRET_ARG_0" in plan.stdout
    up = run_cli("up", str(config), "--log-format", "json", "--until-ready", env=env)
    cmd = "".join(p.read_text() for p in sim.run_dir.rglob("cmd"))
    assert "argv tail sk-server-" in sim.log(1)  # the process got the value
    assert cmd and key not in cmd
    for sink in (plan.stdout, up.stdout, up.stderr):
        assert key not in sink


def test_secret_flag_values_are_masked_for_display() -> None:
    from launcher.sglang.flags import mask_secret_flags, mask_secret_flags_text

    argv = ["python3", "-m", "x", "--api-key", "K1", "--admin-api-key=K2", "--api-k", "K3"]
    assert mask_secret_flags(argv) == ["python3", "-m", "x", "--api-key", "***",
                                       "--admin-api-key=***", "--api-k", "***"]
    text = "python3 -m x --api-key 'K 1' --admin-api-key=K2 --port 1"
    assert mask_secret_flags_text(text) == "python3 -m x --api-key *** --admin-api-key=*** --port 1"


# -- L1: a secret cut at a size limit --------------------------------------------------------

TOKEN = "hf_SecretTokenForCutTest0123456789abcd"  # 38 characters


def test_a_secret_cut_at_the_kept_line_length_is_masked_everywhere(sim: SimSetup) -> None:
    """L1, the review's repro: the 16 KiB cut falls 34 characters into a 38-character token.
    No 8-character piece of the token reaches the event log, the ledger or history."""
    assert len(TOKEN) == 38
    prefix = "ValueError: "
    padding = MAX_KEPT_CHARS - len(prefix) - 34
    code = ("import os, sys; t = os.environ['HF_TOKEN']; "
            f"print('ValueError: ' + 'p' * {padding} + t, flush=True); sys.exit(1)")
    data = script_server(sim, code)
    data["servers"][0]["secret_env"] = {"HF_TOKEN": "env:TEST_HF_TOKEN"}
    config = sim.write_toml(data)
    up = run_cli("up", str(config), "--until-ready", "--log-format", "json",
                 env={"TEST_HF_TOKEN": TOKEN})
    assert TOKEN in sim.log(1)
    history = run_cli("history", "--config", str(config), "--json")
    stored = b"".join(p.read_bytes() for p in sim.state_dir.rglob("*") if p.is_file())
    pieces = [TOKEN[i:i + 8] for i in range(len(TOKEN) - 7)]
    for sink in (up.stdout, up.stderr, history.stdout, stored.decode("utf-8", "replace")):
        assert not [p for p in pieces if p in sink]
    assert "ppp***" in up.stdout + up.stderr


def test_the_redactor_masks_a_secret_cut_at_either_edge() -> None:
    redact = Redactor([TOKEN])
    assert redact.text("x" * 5 + TOKEN[:34]) == "xxxxx***"
    assert redact.text(TOKEN[-12:] + " rest") == "*** rest"
    assert redact.text("tail " + TOKEN[:7]) == "tail " + TOKEN[:7]  # too short to tell


async def test_a_log_tail_cut_inside_a_line_starts_at_the_next_line(tmp_path: Path) -> None:
    """L1, the 64 KiB tail: its first bytes cut a line (here inside the token); that piece is
    dropped, so no end of a secret without its start is kept."""
    from launcher.host import run as remote
    from launcher.host.transport.local import LocalTransport
    from tests.supervise import HOST

    (tmp_path / "log").write_text("x" * 100 + TOKEN + "\nlast words\n")
    handle = remote.RunHandle(server="s", attempt=1, dir=str(tmp_path), pid=1)
    tail = await remote.tail_log(LocalTransport(HOST), handle, nbytes=11 + 30)
    assert tail == b"last words\n"
    whole = await remote.tail_log(LocalTransport(HOST), handle, nbytes=4096)
    assert whole.startswith(b"xxx")

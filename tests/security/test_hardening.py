"""Hostile and broken input (docs/security.md): text from servers, hosts and configs is never
rich markup; forged run-directory files are reported and skipped; remote data is bounded."""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from rich.console import Console

from launcher.cli import app, inspection, up
from launcher.cli.app import EXIT_GAVE_UP, EXIT_NOT_READY
from launcher.config.load import config_from_dict
from launcher.config.schema import SlackConfig
from launcher.errors import ConfigError, HostKeyError, RemoteCommandError, StateError
from launcher.host import health, shell
from launcher.host import run as remote
from launcher.host.transport.base import MAX_OUTPUT, CommandResult
from launcher.host.transport.local import LocalTransport
from launcher.host.transport.ssh import SSHTransport
from launcher.params import LaunchParams
from launcher.sglang.classify import diagnose
from launcher.sglang.logparse import MAX_KEPT_CHARS, MAX_LINE_CHARS, LogFollower
from launcher.store.lock import StateLock
from launcher.supervise.supervisor import ServerSupervisor, Snapshot
from tests.hostile_http import HostileHttp
from tests.sshd import Sshd
from tests.supervise import HOST, Recorder, SimSetup, json_lines, run_cli

pytestmark = pytest.mark.timeout(90)

MARKUP = "ValueError: x [/] [link=https://evil.example/]click[/link] [bold red]loud"


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated process in its own session (what a forged pid file could name)."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def script_server(sim: SimSetup, code: str, **kwargs: Any) -> dict[str, Any]:
    """A config whose server is ``python -c code`` (the launcher's flags land in argv)."""
    return sim.data(mem_fraction_static=0.8, cuda_graph_max_bs=8,
                    server={"command": [sys.executable, "-c", code]}, **kwargs)


def test_up_quotes_a_dying_servers_markup_verbatim(sim: SimSetup) -> None:
    """A server whose last words are rich markup (an unbalanced ``[/]``, a ``[link=...]``)
    makes `up` give up with exit 1 and those words printed verbatim, not a MarkupError."""
    code = f"import sys; print({MARKUP!r}, flush=True); sys.exit(1)"
    config = sim.write_toml(script_server(sim, code))

    up = run_cli("up", str(config), "--until-ready", "--log-format", "json")

    assert EXIT_GAVE_UP == up.returncode, up.stderr
    assert "MarkupError" not in up.stderr
    assert "sim0 gave up" in up.stderr
    assert MARKUP in up.stderr


def rendered(renderable: Any) -> str:
    console = Console(record=True, width=400, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def test_live_view_and_messages_show_server_text_verbatim() -> None:
    """The live view's note cell and every message line show markup, links and emoji codes
    as the characters they are."""
    text = MARKUP + " :warning:"
    snap = Snapshot(server="s[/]", host="h[bold]", state="gave_up", phase=None, progress=None,
                    attempt=1, params="0.8/8", elapsed_s=1.0, pid=None, reason=text)
    view = rendered(up._view([snap]))
    assert text in view and "s[/]" in view and "h[bold]" in view

    console = Console(record=True, width=400, file=io.StringIO())
    app.say(console, ("sim0 gave up", "red"), f": {text}")
    app.error(console, RemoteCommandError(text), "s[/]: ")
    lines = console.export_text().splitlines()
    assert [f"sim0 gave up: {text}", f"s[/]: RemoteCommandError: {text}"] == lines


def test_terminal_escapes_from_a_server_are_shown_not_sent() -> None:
    """An ESC sequence in a log line (clear screen, an OSC 8 hyperlink) reaches the terminal
    as visible ``\\x1b`` text, in messages and in table cells."""
    text = "boom \x1b[2J\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\ \x07"
    console = Console(record=True, width=400, file=io.StringIO(), force_terminal=True)
    app.say(console, ("sim0 gave up", "red"), f": {text}")
    snap = Snapshot(server="s", host="h", state="gave_up", phase=None, progress=None,
                    attempt=1, params="", elapsed_s=1.0, pid=None, reason=text)
    console.print(up._view([snap]))
    raw = console.file.getvalue()  # type: ignore[attr-defined]
    assert "\x1b[2J" not in raw and "\x1b]8" not in raw and "\x07" not in raw
    assert raw.count("\\x1b[2J") == 2 and raw.count("\\x07") == 2


def forge_attempt(sim: SimSetup, attempt: int, **files: str) -> Path:
    d = sim.attempt_dir(attempt)
    d.mkdir(parents=True)
    for name, text in files.items():
        (d / name).write_text(text)
    return d


def test_forged_attempt_files_are_reported_and_skipped(sim: SimSetup) -> None:
    """Attempt directories whose pid, exit_status and started_at are not what they should be
    are reported (``remote.attempt_corrupt``) and skipped by `up`, `status` and `down`: the
    server starts as attempt 3, `status` shows it, `down` stops it."""
    forge_attempt(sim, 1, pid="abc\n", exit_status="abc\n", started_at="2020-01-01\n")
    forge_attempt(sim, 2, pid="1 2\n3\n", exit_status="9" * 5000)
    config = sim.write_toml(sim.data(mem_fraction_static=0.8, cuda_graph_max_bs=8))

    up = run_cli("up", str(config), "--until-ready", "--log-format", "json")

    assert 0 == up.returncode, up.stderr + up.stdout
    corrupt = [e for e in json_lines(up.stdout) if e.get("event") == "remote.attempt_corrupt"]
    assert {"pid"} == {e["file"] for e in corrupt}, corrupt
    assert [1, 2, 3] == sim.attempts() and sim.alive(3)

    status = run_cli("status", str(config), "--json")
    assert 0 == status.returncode, status.stderr
    [row] = json.loads(status.stdout)
    assert (True, 3, sim.pid(3)) == (row["running"], row["attempt"], row["pid"])

    down = run_cli("down", str(config))
    assert 0 == down.returncode, down.stderr
    assert not sim.alive(3)

    # Now the newest attempt is a forged one: status reports it, and still exits.
    forge_attempt(sim, 4, pid="abc", exit_status="abc", started_at="2020-01-01", log="")
    status = run_cli("status", str(config), "--json")
    assert EXIT_NOT_READY == status.returncode, status.stdout + status.stderr
    [row] = json.loads(status.stdout)
    assert (False, 4, None) == (row["running"], row["attempt"], row["exit_status"])
    assert "remote.attempt_corrupt" in status.stderr and "exit_status" in status.stderr


async def test_adopting_an_attempt_with_a_forged_cmd_reports_it(sim: SimSetup) -> None:
    """A cmd file whose params are not numbers (or out of range) adopts with unknown params
    and an ``attempt.corrupt`` event, instead of a ValueError."""
    config = sim.config()
    rec = Recorder()
    sup = ServerSupervisor(config, config.servers[0], LocalTransport(config.hosts[0]),
                           sglang_version="0.5.23", hooks=[rec])
    for n, cmd in enumerate(["x --mem-fraction-static abc --cuda-graph-max-bs 8",
                             "x --mem-fraction-static 7 --cuda-graph-max-bs 8",
                             "x --cuda-graph-max-bs 0"], start=1):
        d = forge_attempt(sim, n, cmd=cmd)
        params = await sup._params_of(remote.RunHandle("sim0", n, str(d), 0))
        assert LaunchParams(None, None) == params
    assert [1, 2, 3] == [e["attempt"] for e in rec.of("attempt.corrupt")]


def test_log_follower_keeps_at_most_16_kib_of_any_line() -> None:
    """Lines of 1 MiB (the splitter's cut) are parsed whole but kept cut to MAX_KEPT_CHARS:
    the tail, the traceback and the failure evidence stay small, the args dump still parses."""
    big = "x" * MAX_LINE_CHARS
    follower = LogFollower(tail=8)
    dump = f"[2026-01-01 00:00:00] server_args=ServerArgs({big[:100_000]}, " \
           "mem_fraction_static=0.81, cuda_graph_max_bs=24)"
    lines = [dump, "Traceback (most recent call last):", f'  File "{big}", line 1',
             f"ValueError: {big}", *[big] * 5, "", f"RuntimeError: CUDA out of memory. {big}",
             *[big] * 10]
    for line in lines:
        follower.feed_line(line)
    follower.finish()

    assert LaunchParams(0.81, 24) == follower.resolved_params
    assert 8 == len(follower.last_lines)
    assert max(map(len, follower.last_lines)) <= MAX_KEPT_CHARS + 64
    held = repr(follower.failures) + repr(diagnose(follower, 1).evidence)
    assert len(held) < 40 * MAX_KEPT_CHARS, len(held)


async def test_health_check_has_a_whole_request_deadline_against_a_trickling_body() -> None:
    """A body trickling a byte every 0.2 s (each read well within httpx's timeout) ends at
    the deadline as a failed check instead of holding the probe for 200 s."""
    with HostileHttp("trickle", body_len=1000, every_s=0.2) as srv:
        async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
            ok, detail = await health.check(client, f"http://127.0.0.1:{srv.port}/health", 1.0)
    assert (False, "no complete answer within 1s") == (ok, detail)
    assert srv.sent < 100


async def test_health_check_reads_at_most_a_few_kib_of_a_huge_body() -> None:
    """An 800 MB /health body: the check reads MAX_BODY bytes, answers from the status line
    and hangs up; the server gets to send no more than what the socket buffers hold."""
    with HostileHttp("huge", body_len=800 << 20) as srv:
        async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
            ok, detail = await health.check(client, f"http://127.0.0.1:{srv.port}/health", 20.0)
        await anyio.sleep(0.2)
    assert (True, "HTTP 200") == (ok, detail)
    assert srv.sent < 64 << 20, srv.sent


class CountingTransport(LocalTransport):
    """A local transport that counts the stdout bytes its commands return."""

    received = 0

    async def run(self, argv: Sequence[str], **kwargs: Any) -> CommandResult:
        result = await super().run(argv, **kwargs)
        self.received += len(result.stdout)
        return result


async def test_status_reads_the_start_and_end_of_a_long_log_only(sim: SimSetup) -> None:
    """`status` of a 10 MiB log reads its first 2 MiB and last 512 KiB: the args dump and the
    ready line at the start, the crash at the end."""
    d = forge_attempt(sim, 1, pid="", exit_status="1", started_at="")
    with (d / "log").open("w") as f:
        f.write("[2026-01-01 00:00:00] server_args=ServerArgs(mem_fraction_static=0.77, "
                "cuda_graph_max_bs=16)\n[2026-01-01 00:00:09] The server is fired up and "
                "ready to roll!\n")
        f.write(f"[2026-01-01 00:00:10] Decode batch. {'x' * 1000}\n" * 10_000)
        f.write("[2026-01-01 01:00:00] Received sigquit from a child process. It usually "
                "means the child failed.\n")
    config = sim.config()
    transport = CountingTransport(HOST)

    row = await inspection.server_status(config, config.servers[0], transport, now=0.0)

    assert (1, False, True, 1, "exited (1)") == (row.attempt, row.running, row.ready,
                                                 row.exit_status, row.state)
    assert {"mem_fraction_static": 0.77, "cuda_graph_max_bs": 16} == row.params
    assert transport.received < 3 << 20, transport.received


JUNK = "head -c 100000000 /dev/zero"  # 100 MB on stdout, like a broken nvidia-smi


async def test_local_run_stops_a_command_past_max_output() -> None:
    """100 MB of stdout: RemoteCommandError once MAX_OUTPUT is passed, the command killed."""
    t = LocalTransport(HOST)
    with pytest.raises(RemoteCommandError, match=f"more than {MAX_OUTPUT} bytes"):
        await t.run(["sh", "-c", JUNK], timeout=60)
    assert (await t.run(["sh", "-c", "head -c 1000 /dev/zero"])).stdout == bytes(1000)


@pytest.mark.ssh
async def test_ssh_run_stops_a_command_past_max_output(sshd_host: Sshd) -> None:
    """The same over SSH: the channel is closed and the connection stays usable."""
    t = SSHTransport("gpu1", **sshd_host.transport_kwargs())
    try:
        with pytest.raises(RemoteCommandError, match=f"more than {MAX_OUTPUT} bytes"):
            await t.run(["sh", "-c", JUNK], timeout=60)
        after = await t.run(["echo", "still usable"])
    finally:
        await t.aclose()
    assert b"still usable\n" == after.stdout


@pytest.mark.ssh
async def test_ssh_timeout_kills_the_command_on_the_host(sshd_host: Sshd, tmp_path: Path) -> None:
    """A command that ignores its closed channel (a hung nvidia-smi: no output, no input) is
    killed on the host by ``timeout`` shortly after launcher's own timeout fires."""
    pid_file = tmp_path / "pid"
    t = SSHTransport("gpu1", **sshd_host.transport_kwargs())
    try:
        with pytest.raises(RemoteCommandError, match="timed out"):
            await t.run(["sh", "-c", f"echo $$ > {pid_file}; exec sleep 300"], timeout=3.0)
    finally:
        await t.aclose()
    pid = int(pid_file.read_text())
    for _ in range(400):  # timeout(1) fires HOST_TIMEOUT_SLACK_S after ours
        if _proc_state(pid) in ("gone", "Z"):
            break
        await anyio.sleep(0.05)
    assert _proc_state(pid) in ("gone", "Z")


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return "gone"


async def test_a_pid_is_trusted_only_with_a_matching_start_time(
    sim: SimSetup, sleeper: subprocess.Popen[bytes],
) -> None:
    """``ours`` refuses pid 1, 0, junk, a live pid without pid_start and one whose pid_start
    does not match; only the pid with its own start time is ours."""
    t = LocalTransport(HOST)
    ident = await t.run(shell.sh(shell.PRELUDE + 'ident "$1"', str(sleeper.pid)))
    d = forge_attempt(sim, 1)
    script = shell.PRELUDE + 'if ours "$1" "$2"; then echo ours; else echo not; fi'

    async def ours(pid: str) -> str:
        result = await t.run(shell.sh(script, str(d), pid))
        return result.stdout.decode().strip()

    assert ["not"] * 4 == [await ours(p) for p in ("1", "0", "-1", str(sleeper.pid))]
    (d / "pid_start").write_text("not the start time\n")
    assert "not" == await ours(str(sleeper.pid))
    (d / "pid_start").write_bytes(ident.stdout)
    assert ["ours", "not"] == [await ours(str(sleeper.pid)), await ours("1")]


def test_down_never_signals_a_pid_without_its_start_time(
    sim: SimSetup, sleeper: subprocess.Popen[bytes],
) -> None:
    """An attempt whose pid file names an unrelated live process (no pid_start) is not
    running: `down` leaves that process alone."""
    forge_attempt(sim, 1, pid=f"{sleeper.pid}\n", log="")
    config = sim.write_toml(sim.data())
    down = run_cli("down", str(config))
    assert (0, "sim0: not running") == (down.returncode, down.stdout.strip()), down.stderr
    assert sleeper.poll() is None


SECRET = "hf_do_not_print_me_3141"


def test_a_token_the_server_prints_is_masked_at_every_sink(sim: SimSetup) -> None:
    """A server that prints its own HF_TOKEN and dies: the JSON event log, the gave-up line,
    the ledger (history and the database file) and the saved log tail show ``***``."""
    code = ("import os, sys; print('loading with token', os.environ['HF_TOKEN'], flush=True); "
            "print(f\"ValueError: token {os.environ['HF_TOKEN']} rejected\", flush=True); "
            "sys.exit(1)")
    data = script_server(sim, code)
    data["servers"][0]["secret_env"] = {"HF_TOKEN": "env:TEST_HF_TOKEN"}
    config = sim.write_toml(data)

    up = run_cli("up", str(config), "--until-ready", "--log-format", "json",
                 env={"TEST_HF_TOKEN": SECRET})

    assert EXIT_GAVE_UP == up.returncode, up.stderr
    assert SECRET in sim.log(1)  # the server did print it
    assert "ValueError: token *** rejected" in up.stderr
    history = run_cli("history", "--config", str(config), "--json")
    saved = [p.read_text() for p in (sim.state_dir / "logs").rglob("*.log")]
    assert saved and all("token ***" in text for text in saved)
    stored = b"".join(p.read_bytes() for p in sim.state_dir.rglob("*") if p.is_file())
    for sink in (up.stdout, up.stderr, history.stdout, *saved):
        assert SECRET not in sink
    assert SECRET.encode() not in stored


async def test_local_commands_inherit_only_a_login_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """launcher's own secrets (the Slack webhook, whatever an env file held) never reach a
    command on the local transport; PATH, HOME, the host's and the command's env do."""
    monkeypatch.setenv("LAUNCHER_SLACK_WEBHOOK", "https://hooks.slack.com/services/T/B/x")
    monkeypatch.setenv("SOME_TOKEN", "from-the-env-file")
    t = LocalTransport(HOST, env={"HOST_VAR": "h"})
    result = await t.run(["env"], env={"CMD_VAR": "c"})
    names = {line.partition("=")[0] for line in result.stdout.decode().splitlines()}
    assert {"PATH", "HOME", "HOST_VAR", "CMD_VAR"} <= names
    assert not names & {"LAUNCHER_SLACK_WEBHOOK", "SOME_TOKEN"}


def spec(run_dir: Path, attempt: int = 1) -> remote.AttemptSpec:
    return remote.AttemptSpec(server="srv", attempt=attempt, run_dir=str(run_dir),
                              argv=["sleep", "30"], env={}, secret_env={"T": "secret"})


async def test_launch_makes_private_directories_and_log(tmp_path: Path) -> None:
    """A fresh run_dir: run_dir, server and attempt directories 0700, the log 0600."""
    t = LocalTransport(HOST)
    handle = await remote.launch(t, spec(tmp_path / "run"))
    try:
        d = Path(handle.dir)
        modes = [stat.S_IMODE(p.stat().st_mode) for p in (d.parent.parent, d.parent, d)]
        assert [0o700] * 3 == modes
        assert 0o600 == stat.S_IMODE((d / "log").stat().st_mode)
    finally:
        await remote.stop(t, handle, grace=1.0)


@pytest.mark.parametrize("how", ["world-writable", "group-writable", "symlink",
                                 "server-world-writable"])
async def test_launch_refuses_a_run_dir_others_could_swap(tmp_path: Path, how: str) -> None:
    """A run_dir (or server directory) that others can write, or a symlink: launch refuses
    with the fix in the error, and starts nothing."""
    run_dir = tmp_path / "run"
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    if how == "symlink":
        run_dir.symlink_to(real)
    else:
        run_dir.mkdir(mode=0o700)
        target = run_dir / "srv" if how.startswith("server") else run_dir
        target.mkdir(exist_ok=True)
        target.chmod(0o777 if "world" in how else 0o770)
    with pytest.raises(RemoteCommandError, match="unsafe run directory") as caught:
        await remote.launch(LocalTransport(HOST), spec(run_dir))
    assert "chmod go-w" in caught.value.remedy
    assert not [p async for p in anyio.Path(tmp_path).rglob("log")]


def _listening_tcp_ports() -> set[int]:
    """Local ports of the TCP sockets this process has listening (from /proc)."""
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                ports.add(int(fields[1].rpartition(":")[2], 16))
    return ports


@pytest.mark.ssh
async def test_ssh_probes_use_a_private_unix_socket_not_a_loopback_port(
    sshd_host: Sshd,
) -> None:
    """The health client over SSH reaches the server through a Unix socket in a 0700
    directory: launcher opens no TCP listener that other local users could connect to."""
    t = SSHTransport("gpu1", **sshd_host.transport_kwargs())
    try:
        with HostileHttp("huge", body_len=2) as srv:
            before = _listening_tcp_ports()
            async with health.client_for(t, srv.port, "127.0.0.1", 10.0) as (client, url):
                during = _listening_tcp_ports()
                ok = await health.check(client, url, 10.0)
                transport = client._transport
                assert isinstance(transport, httpx.AsyncHTTPTransport)
                uds = transport._pool._uds
                assert uds is not None
                mode = stat.S_IMODE(os.stat(os.path.dirname(uds)).st_mode)
    finally:
        await t.aclose()
    assert (True, "HTTP 200") == ok
    assert set() == during - before
    assert 0o700 == mode
    assert not await anyio.Path(uds).exists()


@pytest.mark.parametrize(("change", "expected"), [
    (lambda d: d["servers"][0]["env"].update(A="x\0y"),
     "servers[0].env.A: contains the control character '\\x00' at position 1"),
    (lambda d: d["servers"][0].update(extra_args=["--foo", "a\x1b[2Jb"]),
     "servers[0].extra_args[1]: contains the control character '\\x1b' at position 1"),
    (lambda d: d["servers"][0].update(name=".."), "servers[0].name: '..' is not a valid name"),
    (lambda d: d["hosts"][0].update(jump_host="admin@bastion:ssh"),
     "hosts[0].jump_host: 'admin@bastion:ssh' is not [user@]host[:port]"),
    (lambda d: d["hosts"][0].update(jump_host="bastion:70000"),
     "hosts[0].jump_host: 'bastion:70000' is not [user@]host[:port]"),
    (lambda d: d["hosts"][0].update(run_dir="-rf"),
     "hosts[0].run_dir: '-rf' starts with '-'"),
    (lambda d: d["servers"][0].update(run_dir="--help"),
     "servers[0].run_dir: '--help' starts with '-'"),
])
def test_config_rejects_hostile_values(sim: SimSetup, change: Any, expected: str) -> None:
    """Control characters, a '..' name, a malformed jump_host port, a run_dir read as an
    option: one ConfigError naming the field, never a crash or a retry loop later."""
    data = sim.data()
    change(data)
    with pytest.raises(ConfigError) as caught:
        config_from_dict(data, environ={})
    assert any(p.startswith(expected) for p in caught.value.problems), caught.value.problems


def test_config_accepts_a_good_jump_host_and_multiline_env(sim: SimSetup) -> None:
    data = sim.data()
    data["hosts"][0]["jump_host"] = "admin@bastion.example:2222"
    data["servers"][0]["env"]["NOTE"] = "two\nlines\tand a tab"
    assert config_from_dict(data, environ={}).hosts[0].jump_host == "admin@bastion.example:2222"


@pytest.mark.parametrize(("url", "ok"), [
    ("https://hooks.slack.com/services/T0/B0/xyz", True),
    ("http://127.0.0.1:8080/hook", True),
    ("http://localhost/hook", True),
    ("http://hooks.slack.com/services/T0/B0/xyz", False),
    ("http://127.0.0.1.evil.example/hook", False),
    ("ftp://hooks.slack.com/x", False),
])
def test_slack_webhook_must_be_https_except_loopback(url: str, ok: bool) -> None:
    slack = SlackConfig()
    if ok:
        assert url == slack.webhook_url({"LAUNCHER_SLACK_WEBHOOK": url})
    else:
        with pytest.raises(ConfigError, match="must be https://"):
            slack.webhook_url({"LAUNCHER_SLACK_WEBHOOK": url})


@pytest.mark.ssh
async def test_tofu_that_cannot_record_the_key_is_a_clear_host_key_error(
    sshd_host: Sshd, tmp_path: Path,
) -> None:
    """trust_on_first_use with a known_hosts that cannot be written (here its directory is a
    file; under systemd, a read-only home): HostKeyError naming the file, no connection."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    kwargs = {**sshd_host.transport_kwargs(), "known_hosts": blocker / "known_hosts",
              "trust_on_first_use": True, "retry_attempts": 1}
    t = SSHTransport("gpu1", **kwargs)
    try:
        with pytest.raises(HostKeyError, match="cannot record it in") as caught:
            await t.run(["true"])
    finally:
        await t.aclose()
    assert "known_hosts" in caught.value.remedy


def test_state_lock_refuses_a_symlinked_lock_file(tmp_path: Path) -> None:
    """A symlink at state_dir/launcher.lock: StateError, and the file it names untouched."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (state / "launcher.lock").symlink_to(victim)
    with pytest.raises(StateError, match="cannot open the lock file"), StateLock(state):
        pass
    assert "precious\n" == victim.read_text()

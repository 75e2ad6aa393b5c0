"""Run directories, the state directory and the cwd against another local user (security review
2026-12-05, findings H2, M6, M7, M8, L6).

"Another local user" is ``nobody`` (``setpriv``); the tests run as root, as CI does. Every
process a test signals is one it started.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.cli.app import EXIT_OK
from launcher.errors import RemoteCommandError
from launcher.host import agent as follow_agent
from launcher.host import preflight, run
from launcher.host.transport.local import LocalTransport
from tests import procs
from tests.supervise import HOST, SERVER, SimSetup, run_cli
from tests.supervise import cli_env as launcher_env

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                       reason="needs root and setpriv to act as another user"),
]

ROOT_ONLY = "ROOT-ONLY-CONTENT-6a1f"
SECRET = "hf_secret_in_env_5e2d"
REAL_SLEEP = shutil.which("sleep") or "/bin/sleep"
REAL_SETSID = shutil.which("setsid") or "/usr/bin/setsid"


def as_nobody(script: str, *args: str, cwd: Path | None = None) -> None:
    """``sh -c script`` as user nobody (group nogroup, no supplementary groups)."""
    subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                    "sh", "-c", script, "sh", *args], cwd=cwd, check=True, timeout=30)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory directly under /tmp (so nobody can reach it), root's, mode 0755; a test
    opens it to others as its case needs."""
    path = Path(tempfile.mkdtemp(prefix="launcher-shared-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def root_only(tmp_path: Path) -> Path:
    path = tmp_path / "root-only"
    path.write_text(ROOT_ONLY + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def victim() -> Iterator[subprocess.Popen[bytes]]:
    """A process of root's in a session of its own (what a forged attempt would name)."""
    proc = subprocess.Popen([REAL_SLEEP, "300"], start_new_session=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


# -- H2: a run_dir below a directory another user can write ---------------------------------


def test_status_logs_down_refuse_a_run_dir_another_user_swapped(
    sim: SimSetup, shared: Path, root_only: Path, victim: subprocess.Popen[bytes],
) -> None:
    """The review's H2: `up` runs with run_dir in a team directory; the directory becomes
    world-writable; nobody renames ``runs`` and plants an attempt naming root's process (with
    its real start time) and a ``log`` symlink to a root-only file. `status`, `logs` and
    `down` refuse, naming the directory and the fix; the process lives; the file's content
    is never printed. A new `up` refuses it too, and writes nothing into it."""
    sim.run_dir = shared / "runs"  # the sim's teardown then stops what runs there
    data = sim.data()
    config = sim.write_toml(data)
    up = run_cli("up", str(config), "--until-ready", "--log-format", "json")
    assert EXIT_OK == up.returncode, up.stderr

    shared.chmod(0o777)
    start = procs.ident(victim.pid)
    assert start is not None
    as_nobody('mv runs runs.moved && mkdir -p runs/sim0/1 && printf "%s\\n" "$1" > runs/sim0/1/pid'
              ' && printf "%s" "$2" > runs/sim0/1/pid_start && ln -s "$3" runs/sim0/1/log',
              str(victim.pid), start, str(root_only), cwd=shared)

    outputs = []
    for args in (("status", str(config)), ("logs", str(config), SERVER),
                 ("down", str(config)), ("up", str(config), "--until-ready")):
        result = run_cli(*args)
        outputs.append(result.stdout + result.stderr)
        assert result.returncode != EXIT_OK, (args, result.stdout, result.stderr)
        assert f"unsafe run directory {shared}" in result.stdout + result.stderr, args
        assert "chmod go-w" in result.stdout + result.stderr, args
    assert victim.poll() is None, "down signalled the process the forged attempt names"
    assert all(ROOT_ONLY not in text for text in outputs)
    assert ["log", "pid", "pid_start"] == sorted(p.name for p in (shared / "runs/sim0/1").iterdir())

    # Put the real tree back and stop the real server.
    shutil.rmtree(shared / "runs")
    (shared / "runs.moved").rename(shared / "runs")
    shared.chmod(0o755)
    down = run_cli("down", str(config))
    assert EXIT_OK == down.returncode, down.stderr


def test_up_refuses_a_run_dir_below_a_directory_others_can_write(
    sim: SimSetup, shared: Path,
) -> None:
    """`up` with run_dir in a world-writable, non-sticky directory starts nothing and says
    which directory is unsafe and how to fix it."""
    shared.chmod(0o777)
    sim.run_dir = shared / "runs"
    config = sim.write_toml(sim.data())
    up = run_cli("up", str(config), "--until-ready", "--log-format", "json")
    assert EXIT_OK != up.returncode
    assert f"unsafe run directory {shared}" in up.stdout + up.stderr
    assert not list((shared / "runs").rglob("pid"))


@pytest.mark.parametrize("where", ["tmp", "tmp_path"])
async def test_a_private_run_dir_under_tmp_or_the_tmp_path_works(
    tmp_path: Path, shared: Path, where: str,
) -> None:
    """The check passes the usual places: a run_dir of one's own under /tmp (sticky, root's)
    and under pytest's tmp_path: launch, list, probe, read, follow's finish, stop."""
    run_dir = (shared if where == "tmp" else tmp_path) / "run"
    t = LocalTransport(HOST)
    spec = run.AttemptSpec(server="srv", attempt=1, run_dir=str(run_dir),
                              argv=["sh", "-c", "echo hello; exec sleep 30"], env={})
    handle = await run.launch(t, spec)
    try:
        assert handle == await run.find_running(t, str(run_dir), "srv", adopting=True)
        assert (await run.probe(t, handle)).alive
        assert (await run.attempt_files(t, handle))["cmd"]
        assert 0 <= await run.log_age(t, handle)
    finally:
        report = await run.stop(t, handle, grace=5.0)
    assert ["SIGTERM"] == report.signals_sent
    assert b"hello\n" == await run.read_log(t, handle)
    assert b"hello\n" == await run.tail_log(t, handle)


async def test_listing_refuses_a_symlink_in_an_attempt_directory(tmp_path: Path) -> None:
    """An attempt directory holding a ``log`` symlink (which only its owner could have made)
    is refused by the listing rather than read through."""
    run_dir = tmp_path / "run"
    d = run_dir / "srv" / "1"
    d.mkdir(parents=True, mode=0o700)
    (run_dir / "srv").chmod(0o700)
    run_dir.chmod(0o700)
    (d / "log").symlink_to("/etc/shadow")
    with pytest.raises(RemoteCommandError, match=f"unsafe run directory {d}/log: a symlink"):
        await run.latest_handle(LocalTransport(HOST), str(run_dir), "srv")


async def test_listing_refuses_a_symlinked_run_dir(tmp_path: Path) -> None:
    """A run_dir that is a symlink (to a private directory, even) is refused by the listing,
    as by the launch: the check must see the directory it names, not a link to it."""
    real = tmp_path / "real"
    (real / "srv" / "1").mkdir(parents=True)
    for p in (real, real / "srv", real / "srv" / "1"):
        p.chmod(0o700)
    (tmp_path / "run").symlink_to(real)
    with pytest.raises(RemoteCommandError, match=f"unsafe run directory {tmp_path}/run: a sym"):
        await run.latest_handle(LocalTransport(HOST), str(tmp_path / "run"), "srv")


# -- H2 and L6 in the follow agent ----------------------------------------------------------


def attempt(root: Path, files: dict[str, str | bytes]) -> Path:
    """An attempt directory ``root/run/srv/1`` (0700 all the way) holding ``files``."""
    d = root / "run" / "srv" / "1"
    d.mkdir(parents=True)
    for p in (root / "run", root / "run" / "srv", d):
        p.chmod(0o700)
    for name, content in files.items():
        (d / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    return d


def run_agent(directory: Path, pid: int, rounds: int = 3) -> list[tuple[str, bytes]]:
    """(kind, payload) of the frames an in-process agent sends for ``directory``."""
    out: list[bytes] = []
    now = [0.0]
    agent = follow_agent.Agent(out.append, clock=lambda: now[0], boot_id="boot")
    agent.command(f'{{"op": "add", "key": 1, "dir": "{directory}", "offset": 0, '
                  f'"pid": {pid}}}'.encode())
    for _ in range(rounds):
        agent.round()
        now[0] += follow_agent.SETTLE_S + 1
    frames = []
    data = b"".join(out)
    while data:
        _, kind, _, _, length = follow_agent.HEADER.unpack_from(data)
        start = follow_agent.HEADER.size
        frames.append((chr(kind), data[start:start + length]))
        data = data[start + length:]
    return frames


def test_agent_never_reads_a_log_symlink(tmp_path: Path, root_only: Path) -> None:
    """A ``log`` symlink in an attempt: the agent answers E ("unsafe run directory"), never
    the linked file's bytes."""
    d = attempt(tmp_path, {"exit_status": "0\n"})
    (d / "log").symlink_to(root_only)
    frames = run_agent(d, 999_999_999)
    assert [("E", f"unsafe run directory {d}: a symlink in it".encode())] == frames


def test_agent_refuses_an_attempt_below_a_directory_others_can_write(
    tmp_path: Path, shared: Path,
) -> None:
    """An attempt below a world-writable, non-sticky directory is not followed."""
    shared.chmod(0o777)
    d = attempt(shared, {"exit_status": "0\n", "log": "x\n"})
    frames = run_agent(d, 999_999_999)
    assert 1 == len(frames) and "E" == frames[0][0]
    assert frames[0][1].startswith(f"unsafe run directory {shared}: owned by uid 0, mode 777"
                                   .encode())


def test_agent_reads_at_most_256_bytes_of_pid_start_and_exit_status(
    tmp_path: Path, victim: subprocess.Popen[bytes],
) -> None:
    """A 32 MiB ``pid_start`` (server alive) and a 32 MiB ``exit_status`` (server gone): the
    agent's peak allocation while following both stays far below their size (L6)."""
    huge = b"7" * (32 << 20)
    live = attempt(tmp_path / "a", {"pid_start": huge, "log": "a\n"})
    gone = attempt(tmp_path / "b", {"exit_status": huge, "log": "b\n"})
    tracemalloc.start()
    try:
        run_agent(live, victim.pid, rounds=2)
        frames = run_agent(gone, 999_999_999, rounds=2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 << 20, f"peak {peak} bytes"
    assert "X" == frames[-1][0] and len(frames[-1][1]) <= follow_agent.SMALL_FILE


# -- M6: nothing imported from the directory launcher starts in -----------------------------


def test_nothing_is_imported_from_the_directory_up_starts_in(sim: SimSetup, shared: Path) -> None:
    """nobody plants ``json.py`` in a sticky world-writable directory; root runs the installed
    ``launcher up`` from there (local host): no process of root's imports it."""
    shared.chmod(0o1777)
    marker = shared / "marker"
    planted = (
        "import os, sys\n"
        f"with open({str(marker)!r}, 'a') as fh:\n"
        "    fh.write('%d %r\\n' % (os.getuid(), sys.argv))\n"
        "here = os.path.dirname(os.path.abspath(__file__))\n"
        "sys.path[:] = [p for p in sys.path if os.path.abspath(p or '.') != here]\n"
        "del sys.modules['json']\n"
        "import json as _real\n"
        "sys.modules['json'] = _real\n"
        "globals().update(_real.__dict__)\n"
    )
    as_nobody('cat > json.py <<"EOF"\n' + planted + 'EOF\n', cwd=shared)
    config = sim.write_toml(sim.data())
    launcher = Path(sys.executable).with_name("launcher")
    try:
        up = subprocess.run([str(launcher), "up", str(config), "--until-ready",
                             "--log-format", "json"], cwd=shared, env=launcher_env(),
                            capture_output=True, text=True, timeout=90)
        assert EXIT_OK == up.returncode, up.stderr
        assert not marker.exists(), marker.read_text()
    finally:
        run_cli("down", str(config))


async def test_the_port_probe_imports_nothing_from_the_hosts_python_path(tmp_path: Path) -> None:
    """The port probe is stdlib python3 run with ``-I``: a ``socket.py`` on the host's
    PYTHONPATH (or in the directory commands start in) is not imported."""
    planted = tmp_path / "planted"
    planted.mkdir()
    marker = tmp_path / "marker"
    (planted / "socket.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                       "raise SystemExit(3)\n")
    transport = LocalTransport(HOST, env={"PYTHONPATH": str(planted)})
    assert await preflight.port_in_use(transport, 1) in (True, False)
    assert not marker.exists()


# -- M7: the launch's pid wait and its claim ------------------------------------------------


@pytest.fixture
def slow_host(tmp_path: Path) -> Iterator[tuple[Path, LocalTransport]]:
    """A local host whose ``setsid`` waits until the file ``gate`` exists and whose ``sleep``
    (the launch's 50 ms tick) is driven by the file ``mode``: ``fast`` returns at once,
    ``gate-at-100`` opens the gate at the 100th tick (launch's old limit was 41) and then
    really sleeps, ``kill-at-50`` kills the launch script at the 50th (a launcher that died
    half-way), ``real`` sleeps. ``ticks`` counts the calls."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "setsid").write_text(
        f"#!/bin/sh\nwhile [ ! -e {fake}/gate ]; do {REAL_SLEEP} 0.02; done\n"
        f'exec {REAL_SETSID} "$@"\n')
    (fake / "sleep").write_text(
        "#!/bin/sh\n"
        f"d={fake}\n"
        'n=$(($(cat "$d/ticks" 2>/dev/null || echo 0) + 1)); echo "$n" > "$d/ticks"\n'
        'case $(cat "$d/mode") in\n'
        f'  gate-at-100) [ "$n" -ge 100 ] && {{ : > "$d/gate"; exec {REAL_SLEEP} "$@"; }} ;;\n'
        '  kill-at-50) [ "$n" -ge 50 ] && { echo real > "$d/mode"; kill -9 "$PPID"; } ;;\n'
        f'  real) exec {REAL_SLEEP} "$@" ;;\n'
        "esac\n"
        "exit 0\n")
    for name in ("setsid", "sleep"):
        (fake / name).chmod(0o755)
    (fake / "mode").write_text("fast\n")
    yield fake, LocalTransport(HOST, env={"PATH": f"{fake}:{os.environ['PATH']}"})
    (fake / "gate").touch()  # whatever still waits goes on (and its shim exits 125)


def slow_spec(tmp_path: Path) -> run.AttemptSpec:
    return run.AttemptSpec(server="srv", attempt=1, run_dir=str(tmp_path / "run"),
                              argv=[REAL_SLEEP, "30"], env={}, secret_env={"HF_TOKEN": SECRET})


def settle(d: Path) -> str:
    """The attempt's exit status once its wrapper recorded it (the shim's 125)."""
    deadline = time.monotonic() + 30
    while not (d / "exit_status").exists():
        assert time.monotonic() < deadline, "the wrapper never recorded an exit status"
        time.sleep(0.02)
    return (d / "exit_status").read_text().strip()


def secret_left(d: Path) -> list[str]:
    return [p.name for p in d.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]


async def test_a_slow_start_is_waited_for_past_the_old_two_seconds(
    tmp_path: Path, slow_host: tuple[Path, LocalTransport],
) -> None:
    """A setsid that only gets going after 100 ticks of the pid wait (5 s of the launch's
    clock): the launch waits for it and returns the running server."""
    fake, t = slow_host
    (fake / "mode").write_text("gate-at-100\n")
    handle = await run.launch(t, slow_spec(tmp_path))
    try:
        assert int((fake / "ticks").read_text()) >= 100
        assert (await run.probe(t, handle)).alive
    finally:
        await run.stop(t, handle, grace=5.0)
    assert not secret_left(Path(handle.dir))


async def test_a_launch_that_saw_no_pid_takes_the_claim_and_the_env(
    tmp_path: Path, slow_host: tuple[Path, LocalTransport],
) -> None:
    """A setsid stuck past the whole pid wait: the launch takes the claim (the server never
    starts, even once setsid goes on) and leaves no env file with the secret behind."""
    fake, t = slow_host
    with pytest.raises(RemoteCommandError) as caught:
        await run.launch(t, slow_spec(tmp_path))
    assert "it will not start" in caught.value.stderr
    d = tmp_path / "run" / "srv" / "1"
    assert (d / "claim").is_dir()
    assert not secret_left(d)
    (fake / "mode").write_text("real\n")
    (fake / "gate").touch()
    assert "125" == settle(d)
    assert not (d / "pid").exists() and not secret_left(d)


async def test_adopting_a_half_way_launch_claims_it_and_removes_its_env(
    tmp_path: Path, slow_host: tuple[Path, LocalTransport],
) -> None:
    """The launcher died 50 ticks into the pid wait; the next one's adopting listing claims
    the attempt: its server never starts and its env file (the secret) is gone."""
    fake, t = slow_host
    (fake / "mode").write_text("kill-at-50\n")
    with pytest.raises(RemoteCommandError):
        await run.launch(t, slow_spec(tmp_path))
    d = tmp_path / "run" / "srv" / "1"
    assert 50 == int((fake / "ticks").read_text())
    assert (d / "env").exists()  # the launcher died with it there
    assert await run.find_running(t, str(tmp_path / "run"), "srv", adopting=True) is None
    assert (d / "claim").is_dir() and not secret_left(d)
    (fake / "gate").touch()
    assert "125" == settle(d)
    assert not (d / "pid").exists() and not secret_left(d)


async def test_a_shim_that_finds_the_attempt_claimed_removes_its_env(
    tmp_path: Path, slow_host: tuple[Path, LocalTransport],
) -> None:
    """A launcher died half-way and another took the claim but died before removing ``env``:
    the shim, once it runs, removes the env file before it gives up (exit 125)."""
    fake, t = slow_host
    (fake / "mode").write_text("kill-at-50\n")
    with pytest.raises(RemoteCommandError):
        await run.launch(t, slow_spec(tmp_path))
    d = tmp_path / "run" / "srv" / "1"
    (d / "claim").mkdir()
    assert secret_left(d) == ["env"]
    (fake / "gate").touch()
    assert "125" == settle(d)
    assert not (d / "pid").exists() and not secret_left(d)


# -- M8: the state directory -----------------------------------------------------------------


def dying_server(sim: SimSetup, state_dir: Path) -> Path:
    code = "print('RuntimeError: attacker-chosen text', flush=True); raise SystemExit(1)"
    data = sim.data(mem_fraction_static=0.8, cuda_graph_max_bs=8,
                    server={"command": [sys.executable, "-c", code]},
                    policy={"max_attempts": 1})
    data["state_dir"] = str(state_dir)
    return sim.write_toml(data)


def test_up_refuses_a_state_dir_another_user_made_first(
    sim: SimSetup, shared: Path, root_only: Path,
) -> None:
    """nobody pre-creates STATE (0777), STATE/logs/sim0 and attempt-1.log -> a root-only
    file: `up` refuses the state directory, naming it and the fix, and the file is intact."""
    shared.chmod(0o1777)
    state = shared / "state"
    as_nobody('mkdir -m 777 state && mkdir -p -m 777 state/logs/sim0 && '
              'ln -s "$1" state/logs/sim0/attempt-1.log', str(root_only), cwd=shared)
    up = run_cli("up", str(dying_server(sim, state)), "--until-ready", "--log-format", "json")
    assert EXIT_OK != up.returncode
    assert f"unsafe state directory {state}" in up.stderr
    assert ROOT_ONLY + "\n" == root_only.read_text()
    assert not sim.attempts()  # nothing started


def test_a_saved_log_tail_replaces_a_planted_symlink(sim: SimSetup, root_only: Path) -> None:
    """A symlink at a log tail's path is replaced by the tail, never written through; the
    directories on the way are 0700."""
    folder = sim.state_dir / "logs" / SERVER
    folder.mkdir(parents=True, mode=0o700)
    (sim.state_dir / "logs").chmod(0o700)
    sim.state_dir.chmod(0o700)
    (folder / "attempt-1.log").symlink_to(root_only)
    up = run_cli("up", str(dying_server(sim, sim.state_dir)), "--until-ready",
                 "--log-format", "json")
    assert EXIT_OK != up.returncode
    assert ROOT_ONLY + "\n" == root_only.read_text()
    saved = folder / "attempt-1.log"
    assert not saved.is_symlink()
    assert "attacker-chosen text" in saved.read_text()
    assert 0o600 == stat.S_IMODE(saved.stat().st_mode)
    with contextlib.suppress(FileNotFoundError):
        assert [] == [p.name for p in folder.iterdir() if p.name.startswith(".")]

"""Log levels of supervision events and journald priority prefixes (launcher.hooks.logging).

The end-to-end tests run `launcher up` as a real subprocess against a simulated server that
SGLang rejects (bad argument: one failed attempt, then give-up) with its stdout in a file; for
the journald case ``$JOURNAL_STREAM`` names that file's device and inode, exactly as systemd
sets it for a unit whose output goes to the journal.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import structlog

from launcher.hooks.logging import configure, on_journal, syslog_priority
from launcher.supervise.events import EVENTS
from tests.supervise import REPO, SERVER, SimSetup, cli_argv, cli_env

pytestmark = pytest.mark.timeout(90)

PREFIXED = re.compile(r"^<([0-7])>(\{.*\})$")


def test_event_classes_name_the_warnings_and_the_errors() -> None:
    for name in ("attempt.failed", "process.died", "stall.detected", "server.unhealthy",
                 "port.waiting"):
        assert logging.WARNING == EVENTS[name].level, name
    for name in ("server.gave_up", "server.internal_error", "router.internal_error",
                 "lease.lost"):
        assert logging.ERROR == EVENTS[name].level, name
    assert logging.WARNING == EVENTS["lease.acquired"].level  # a takeover
    assert logging.INFO == EVENTS["server.ready"].level
    assert 10 == sum(cls.level != logging.INFO for cls in EVENTS.values())


def test_syslog_priorities_follow_sd_daemon() -> None:
    assert [3, 4, 6, 7, 6] == [
        syslog_priority(m) for m in ("error", "warning", "info", "debug", "odd")
    ]


def test_on_journal_compares_device_and_inode(tmp_path: Path) -> None:
    path = tmp_path / "out"
    with path.open("w") as out:
        st = os.fstat(out.fileno())
        assert on_journal(out, {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
        assert not on_journal(out, {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino + 1}"})
        assert not on_journal(out, {"JOURNAL_STREAM": "garbage"})
        assert not on_journal(out, {})
    assert not on_journal(io.StringIO(), {"JOURNAL_STREAM": "1:2"})


def test_configure_prefixes_each_line_only_on_the_journal(tmp_path: Path) -> None:
    path = tmp_path / "out"
    before = list(logging.getLogger().handlers)
    try:
        with path.open("w") as out:
            st = os.fstat(out.fileno())
            configure("console", out, environ={"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
            log = structlog.get_logger("t")
            log.warning("x.warned")
            log.log(EVENTS["server.gave_up"].level, "server.gave_up")
            log.info("x.said")
            configure("console", out, environ={})
            log.warning("x.plain")
        lines = path.read_text().splitlines()
    finally:
        for handler in set(logging.getLogger().handlers) - set(before):
            logging.getLogger().removeHandler(handler)
        structlog.reset_defaults()
    assert ["<4>", "<3>", "<6>"] == [line[:3] for line in lines[:3]]
    assert "x.plain" in lines[3] and not lines[3].startswith("<")


def test_stdlib_warnings_reach_the_journal_with_their_priority(tmp_path: Path) -> None:
    """A library's logging warning (asyncssh, httpx) becomes a log.record line with <4>."""
    path = tmp_path / "out"
    root = logging.getLogger()
    before = list(root.handlers)
    try:
        with path.open("w") as out:
            st = os.fstat(out.fileno())
            environ = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
            configure("json", out, environ=environ)
            configure("json", out, environ=environ)  # again: still one line per record
            logging.getLogger("asyncssh").warning("Connection lost to %s", "gpu1")
            logging.getLogger("asyncssh").info("Opening SSH connection")  # below warning
        lines = path.read_text().splitlines()
    finally:
        for handler in set(root.handlers) - set(before):
            root.removeHandler(handler)
        structlog.reset_defaults()
    [line] = lines
    m = PREFIXED.match(line)
    assert m is not None and "4" == m[1], line
    record = json.loads(m[2])
    assert ("log.record", "asyncssh", "Connection lost to gpu1", "warning") == (
        record["event"], record["logger"], record["message"], record["level"])


def _up(sim: SimSetup, tmp_path: Path, *, journal: bool) -> list[tuple[int | None, Any]]:
    """`launcher up --until-ready --log-format json` of a server SGLang rejects; each stdout
    line as (priority prefix or None, parsed JSON)."""
    config = sim.write_toml(sim.data(mem_fraction_static=0.8, cuda_graph_max_bs=8,
                                     server={"extra_args": ["--no-such-flag"]}))
    out_path = tmp_path / "stdout"
    with out_path.open("w") as out:
        st = os.fstat(out.fileno())
        env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"} if journal else {}
        proc = subprocess.run(cli_argv("up", str(config), "--until-ready", "--log-format",
                                       "json"), cwd=REPO, env=cli_env(env), stdout=out,
                              stderr=subprocess.PIPE, text=True, timeout=60)
    assert 4 == proc.returncode, proc.stderr
    parsed = []
    for line in out_path.read_text().splitlines():
        m = PREFIXED.match(line)
        parsed.append((int(m[1]), json.loads(m[2])) if m else (None, json.loads(line)))
    return parsed


def test_under_journald_every_line_carries_its_priority(sim: SimSetup, tmp_path: Path) -> None:
    lines = _up(sim, tmp_path, journal=True)
    assert lines and all(prio is not None for prio, _ in lines), lines
    by_event = {e["event"]: (prio, e["level"]) for prio, e in lines}
    assert (4, "warning") == by_event["attempt.failed"]
    assert (3, "error") == by_event["server.gave_up"]
    assert (6, "info") == by_event["attempt.started"]


def test_outside_journald_lines_are_plain_json_with_the_level(
    sim: SimSetup, tmp_path: Path
) -> None:
    lines = _up(sim, tmp_path, journal=False)
    assert lines and all(prio is None for prio, _ in lines)
    levels = {e["event"]: e["level"] for _, e in lines}
    assert ("warning", "error") == (levels["attempt.failed"], levels["server.gave_up"])


def test_under_journald_the_messages_on_stderr_carry_their_priority(
    sim: SimSetup, tmp_path: Path
) -> None:
    """stdout and stderr both on the journal stream, as systemd connects them: a config error
    that stops launcher is an error line (<3>) on every line, not info, so it shows under
    `journalctl -p err`; so are the give-ups after the error events."""
    bad = tmp_path / "bad.toml"
    bad.write_text("[policy]\nmax_attempts = 'many'\n[policy]\n")
    config = sim.write_toml(sim.data(mem_fraction_static=0.8, cuda_graph_max_bs=8,
                                     server={"extra_args": ["--no-such-flag"]}))
    outputs = {}
    for name, path in (("bad", bad), ("gave_up", config)):
        out_path = tmp_path / f"{name}.journal"
        with out_path.open("w") as out:
            st = os.fstat(out.fileno())
            env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
            proc = subprocess.run(cli_argv("up", str(path), "--until-ready", "--log-format",
                                           "json"), cwd=REPO, env=cli_env(env), stdout=out,
                                  stderr=out, timeout=60)
        outputs[name] = (proc.returncode, out_path.read_text().splitlines())

    code, lines = outputs["bad"]
    assert 2 == code, lines
    assert len(lines) >= 2 and all(line.startswith("<3>") for line in lines), lines
    assert lines[0].startswith("<3>ConfigError: "), lines
    code, lines = outputs["gave_up"]
    assert 4 == code, lines
    assert all(re.match(r"^<[0-7]>", line) for line in lines), [
        line for line in lines if not re.match(r"^<[0-7]>", line)]
    plain = [line for line in lines if not PREFIXED.match(line)]  # not JSON events
    assert any(line.startswith(f"<3>{SERVER} gave up: ") for line in plain), plain

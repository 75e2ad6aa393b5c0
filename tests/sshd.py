"""A real OpenSSH ``sshd`` on 127.0.0.1 for tests, with generated keys in a temp directory.

Each :class:`Sshd` owns one directory holding its host key, a client key pair authorised to log in,
an ``authorized_keys`` file, a ``known_hosts`` file that trusts the host key, the config and the
daemon's log. Several instances can run at once (each picks its own free port).

Resource handling: :meth:`Sshd.start` launches ``sshd -D -e`` as a child process and waits until
the port answers with an SSH banner; :meth:`Sshd.stop` terminates it and every per-connection
child it forked. Error handling: a missing ``sshd``/``ssh-keygen`` binary or a daemon that does not
come up raises :class:`SshdError` with the daemon's log, so tests that need SSH fail loudly instead
of skipping.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import IO

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd")
# Privilege separation directory; Debian's sshd refuses to start without it.
PRIVSEP_DIR = Path("/run/sshd")


class SshdError(RuntimeError):
    """The test sshd could not be started or controlled."""


def find_sshd() -> str:
    """Return the absolute path of ``sshd`` (re-exec requires one); raise SshdError if absent."""
    for candidate in SSHD_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("sshd")
    if found is None:
        raise SshdError("sshd not found: install openssh-server (apt-get install openssh-server)")
    return os.path.abspath(found)


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now (tests.simhost's
    rule: from below the ephemeral range, so no port-0 bind elsewhere takes it meanwhile)."""
    from tests.simhost import free_ports  # simhost is heavier; sshd.py stays importable alone

    return free_ports(1)[0]


def keygen(path: Path, comment: str) -> None:
    """Generate an unencrypted ed25519 key pair at ``path`` and ``path.pub``."""
    if shutil.which("ssh-keygen") is None:
        raise SshdError("ssh-keygen not found: install openssh-client")
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )


def fingerprint(public_key_file: Path) -> str:
    """Return the ``SHA256:...`` fingerprint of a public key file (as ``ssh-keygen -l``)."""
    out = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", str(public_key_file)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.split()[1]


def _children(pid: int) -> list[int]:
    """Return the pids whose parent is ``pid`` (read from /proc/*/stat)."""
    result = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # the process exited while we looked
        # Field 4 is the ppid; the command name (field 2) may contain spaces, so split after ')'.
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            result.append(int(entry.name))
    return result


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _sshd_descendants(pid: int) -> list[int]:
    """Pids of the sshd processes below ``pid`` (per-connection monitors and their children)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in _children(todo.pop()):
            if _comm(child).startswith("sshd"):
                found.append(child)
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class Sshd:
    """One real sshd listening on 127.0.0.1:``port``, configured for key login as ``user``.

    Attributes after construction: ``host`` ("127.0.0.1"), ``port``, ``user``, ``identity_file``
    (private key that may log in), ``known_hosts`` (trusts exactly this daemon's host key),
    ``host_key_fingerprint`` ("SHA256:..."), ``host_public_key`` (the ``ssh-ed25519 AAAA...``
    line), ``directory``.
    """

    host = "127.0.0.1"

    def __init__(self, directory: Path, *, max_sessions: int | None = 50) -> None:
        """``max_sessions`` None leaves MaxSessions at OpenSSH's default (10): a stock host."""
        self.max_sessions = max_sessions
        self.exec_prefix: list[str] = []  # e.g. ["ip", "netns", "exec", NS]: must exec sshd
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.sshd_path = find_sshd()
        self.user = "root" if os.geteuid() == 0 else getpass.getuser()
        self.port = free_port()
        self.host_key = directory / "ssh_host_ed25519_key"
        self.identity_file = directory / "id_ed25519"
        self.authorized_keys = directory / "authorized_keys"
        self.known_hosts = directory / "known_hosts"
        self.config_file = directory / "sshd_config"
        self.pid_file = directory / "sshd.pid"
        self.log_file = directory / "sshd.log"
        keygen(self.host_key, "test-host")
        keygen(self.identity_file, "test-user")
        self.host_public_key = " ".join(Path(f"{self.host_key}.pub").read_text().split()[:2])
        self.host_key_fingerprint = fingerprint(Path(f"{self.host_key}.pub"))
        self.authorized_keys.write_text(Path(f"{self.identity_file}.pub").read_text())
        self.authorized_keys.chmod(0o600)
        self.known_hosts.write_text(self.known_hosts_line())
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_handle: IO[bytes] | None = None
        self._probe_ports: set[int] = set()

    def known_hosts_line(self) -> str:
        """The line ``[127.0.0.1]:PORT ssh-ed25519 AAAA...`` that trusts this daemon."""
        return f"[{self.host}]:{self.port} {self.host_public_key}\n"

    def transport_kwargs(self) -> dict[str, object]:
        """Keyword arguments for ``SSHTransport(name, **kwargs)`` that reach this daemon.

        ``use_ssh_config`` is off so the tests do not depend on the caller's ``~/.ssh/config``.
        """
        return {
            "address": self.host,
            "port": self.port,
            "user": self.user,
            "identity_file": self.identity_file,
            "known_hosts": self.known_hosts,
            "use_ssh_config": False,
        }

    def authorize(self, public_key_file: Path) -> None:
        """Also accept logins with the key whose public half is ``public_key_file``."""
        with self.authorized_keys.open("a") as fh:
            fh.write(public_key_file.read_text())

    def _write_config(self) -> None:
        lines = [
            f"Port {self.port}",
            f"ListenAddress {self.host}",
            f"HostKey {self.host_key}",
            f"AuthorizedKeysFile {self.authorized_keys}",
            f"PidFile {self.pid_file}",
            "PermitRootLogin yes",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "StrictModes no",
            "UsePAM no",
            "AllowTcpForwarding yes",
            "ClientAliveInterval 2",
            "ClientAliveCountMax 3",
            "MaxStartups 50",
            "LoginGraceTime 20",
            "AcceptEnv LAUNCHER_*",
            "SetEnv LAUNCHER_TEST_SSHD=1",
            "LogLevel VERBOSE",
            "Subsystem sftp internal-sftp",
        ]
        if self.max_sessions is not None:
            lines.append(f"MaxSessions {self.max_sessions}")
        self.config_file.write_text("\n".join(lines) + "\n")

    def start(self, timeout: float = 10.0) -> None:
        """Start the daemon and return once the port answers with an SSH banner."""
        PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
        self._write_config()
        log = self.log_file.open("ab")
        self._log_handle = log
        self._proc = subprocess.Popen(
            [*self.exec_prefix, self.sshd_path, "-D", "-e", "-f", str(self.config_file)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                raise SshdError(
                    f"sshd exited with status {self._proc.returncode}:\n{self.log_text()}"
                )
            if self._banner_ok():
                return
            if time.monotonic() > deadline:
                self.stop()
                raise SshdError(f"sshd did not answer on port {self.port}:\n{self.log_text()}")
            time.sleep(0.02)

    def _banner_ok(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=1.0) as sock:
                # Remember the probe's source port so connections_seen() can leave it out.
                self._probe_ports.add(int(sock.getsockname()[1]))
                return sock.recv(8).startswith(b"SSH-2.0")
        except OSError:
            return False

    @property
    def pid(self) -> int:
        """Pid of the listening daemon."""
        if self._proc is None:
            raise SshdError("sshd is not running")
        return self._proc.pid

    def connection_pids(self) -> list[int]:
        """Pids of every per-connection sshd process (the listener's sshd descendants)."""
        return _sshd_descendants(self.pid)

    def kill_connections(self, timeout: float = 5.0) -> int:
        """SIGKILL every per-connection sshd process but keep the listener: an SSH drop.

        Commands the sessions started are left running (only sshd processes are killed).
        Returns how many processes were killed, after they are gone.
        """
        pids = self.connection_pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while any(_alive(pid) for pid in pids):
            if time.monotonic() > deadline:
                raise SshdError(f"sshd connection processes {pids} survived SIGKILL")
            time.sleep(0.01)
        return len(pids)

    def pause(self) -> None:
        """SIGSTOP the listener: the kernel still accepts connections, nobody answers them."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Undo :meth:`pause`."""
        os.kill(self.pid, signal.SIGCONT)

    def accepted_logins(self) -> int:
        """How many logins the daemon accepted so far (counted in its log)."""
        return self.log_text().count("Accepted publickey for ")

    def connections_seen(self) -> int:
        """How many TCP connections clients made so far (from its log; start-up probes excluded)."""
        ports = re.findall(r"^Connection from \S+ port (\d+) ", self.log_text(), re.MULTILINE)
        return sum(1 for port in ports if int(port) not in self._probe_ports)

    def log_text(self) -> str:
        """Everything the daemon logged so far."""
        try:
            return self.log_file.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """Terminate the listener and its per-connection children; idempotent."""
        proc = self._proc
        if proc is None:
            return
        self._proc = None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)  # a paused daemon cannot handle SIGTERM
            children = _sshd_descendants(proc.pid)
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
            for pid in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None

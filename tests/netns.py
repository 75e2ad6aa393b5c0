"""A real sshd behind its own network namespace, so that tests can cut and heal its network.

:class:`NetnsSshd` is a :class:`tests.sshd.Sshd` started with ``ip netns exec`` inside a fresh
namespace joined to this one by a veth pair (a /30 of 10.200.0.0/13 picked at random, so
concurrent test runs do not collide). Everything the daemon starts (servers, their HTTP ports)
lives in the namespace; files are shared as usual.

:meth:`NetnsSshd.cut` takes the namespace's end of the veth down: packets to the host are
silently dropped (the route here stays, like a pulled cable further down the path), so
established connections hang until keepalives give up and new ones time out.
:meth:`NetnsSshd.heal` brings it back up.

Resource handling: :meth:`NetnsSshd.stop` stops the daemon and deletes the namespace (which
removes both veth ends). Needs root and iproute2; a missing ``ip`` or a refused ``ip netns add``
raises SshdError (tests fail, they never skip).
"""

from __future__ import annotations

import contextlib
import random
import shutil
import subprocess
from pathlib import Path

from tests.sshd import Sshd, SshdError


def _ip(*args: str) -> None:
    if shutil.which("ip") is None:
        raise SshdError("ip (iproute2) not found: install iproute2")
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SshdError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")


class NetnsSshd(Sshd):
    """An sshd in its own network namespace at ``host`` (10.x.y.z), reachable over a veth."""

    def __init__(self, directory: Path, *, max_sessions: int | None = None) -> None:
        tag = random.randrange(1 << 16)
        self.ns = f"lt-{tag:04x}-{random.randrange(1 << 16):04x}"
        self.outer, self.inner = f"vt{tag:04x}a", f"vt{tag:04x}b"
        subnet = random.randrange(1 << 17)  # a /30 in 10.200.0.0/13
        base = (10 << 24) | (200 << 16) | (subnet << 2)
        self.outer_address = _dotted(base + 1)
        self.host = _dotted(base + 2)
        self._made = False
        super().__init__(directory, max_sessions=max_sessions)
        self.exec_prefix = ["ip", "netns", "exec", self.ns]

    def _make_namespace(self) -> None:
        _ip("netns", "add", self.ns)
        self._made = True
        _ip("link", "add", self.outer, "type", "veth", "peer", "name", self.inner)
        _ip("link", "set", self.inner, "netns", self.ns)
        _ip("addr", "add", f"{self.outer_address}/30", "dev", self.outer)
        _ip("link", "set", self.outer, "up")
        _ip("-n", self.ns, "addr", "add", f"{self.host}/30", "dev", self.inner)
        _ip("-n", self.ns, "link", "set", self.inner, "up")
        _ip("-n", self.ns, "link", "set", "lo", "up")

    def start(self, timeout: float = 10.0) -> None:
        if not self._made:
            self._make_namespace()
        super().start(timeout)

    def cut(self) -> None:
        """Drop every packet between here and the host (its end of the link goes down)."""
        _ip("-n", self.ns, "link", "set", self.inner, "down")

    def heal(self) -> None:
        """Undo :meth:`cut`."""
        _ip("-n", self.ns, "link", "set", self.inner, "up")

    def stop(self) -> None:
        super().stop()
        if self._made:
            self._made = False
            with contextlib.suppress(SshdError):
                _ip("netns", "del", self.ns)


def _dotted(address: int) -> str:
    return ".".join(str((address >> shift) & 0xFF) for shift in (24, 16, 8, 0))
